#!/usr/bin/env bash
# The pull-request comment: `gpuplat plan --base` as markdown, for every stack file the change touches, and
# for every stack when the change touches the program (infra/, roles/, playbooks/, pyproject.toml): the
# base revision is planned by its own code, so a code-only change shows with its values.
# Usage: scripts/ci/plan-comment.sh BASE_REF [OUTPUT_FILE]   (BASE_REF: e.g. origin/main)
# Exit: 0 (comment written; the comment carries each stack's policy verdict, policy-report.sh fails the
# job on it), 2 bad input.
set -euo pipefail
base=${1:?usage: plan-comment.sh BASE_REF [OUTPUT_FILE]}
out=${2:-plan-comment.md}
gpuplat=${GPUPLAT:-gpuplat}
if ! git rev-parse --verify --quiet "${base}^{commit}" >/dev/null; then
    echo "plan-comment.sh: ${base} is not a revision of this repository (fetch it first: git fetch origin)" >&2
    exit 2
fi
program_changed=$(git diff --name-only "${base}...HEAD" -- infra roles playbooks pyproject.toml | head -n 1)
if [ -n "$program_changed" ]; then
    mapfile -t stacks < <({ git diff --name-only "${base}...HEAD" -- 'stacks/Pulumi.*.yaml'; \
        git ls-files -- 'stacks/Pulumi.*.yaml'; } | sort -u)
else
    mapfile -t stacks < <(git diff --name-only "${base}...HEAD" -- 'stacks/Pulumi.*.yaml' | sort)
fi
tmp=$(mktemp "${out}.XXXXXX")
trap 'rm -f "$tmp"' EXIT
{
    if [ "${#stacks[@]}" -eq 0 ]; then
        echo "### gpuplat plan"
        echo
        echo "No stack file and no code of the program changed against \`${base}\`."
    fi
    for file in "${stacks[@]}"; do
        if [ ! -f "$file" ]; then
            echo "### gpuplat plan: \`${file}\` removed"
            echo
            continue
        fi
        # The plan's exit code is the policy verdict (in the comment); the comment is written either way.
        "$gpuplat" plan --stack-file "$file" --base "$base" --format markdown || [ $? -eq 1 ]
        echo
    done
} >"$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "plan-comment.sh: wrote ${out} (${#stacks[@]} stack file(s) planned)" >&2
