#!/usr/bin/env bash
# The pull-request comment: `gpuplat plan --base` of every stack file the change touches, as markdown.
# Usage: scripts/ci/plan-comment.sh BASE_REF [OUTPUT_FILE]   (BASE_REF: e.g. origin/main)
# Exit: 0 (comment written; policy verdicts are the job of policy-report.sh), 2 bad input.
set -euo pipefail
base=${1:?usage: plan-comment.sh BASE_REF [OUTPUT_FILE]}
out=${2:-plan-comment.md}
gpuplat=${GPUPLAT:-gpuplat}
if ! git rev-parse --verify --quiet "${base}^{commit}" >/dev/null; then
    echo "plan-comment.sh: ${base} is not a revision of this repository (fetch it first: git fetch origin)" >&2
    exit 2
fi
mapfile -t stacks < <(git diff --name-only "${base}...HEAD" -- 'stacks/Pulumi.*.yaml' | sort)
{
    if [ "${#stacks[@]}" -eq 0 ]; then
        echo "### gpuplat plan"
        echo
        echo "No stack file changed against \`${base}\`."
    fi
    for file in "${stacks[@]}"; do
        if [ ! -f "$file" ]; then
            echo "### gpuplat plan: \`${file}\` removed"
            echo
            continue
        fi
        # The plan's exit code is the policy verdict; the comment is written either way.
        "$gpuplat" plan --stack-file "$file" --base "$base" --format markdown || [ $? -eq 1 ]
        echo
    done
} >"$out"
echo "plan-comment.sh: wrote ${out} (${#stacks[@]} stack file(s) changed)" >&2
