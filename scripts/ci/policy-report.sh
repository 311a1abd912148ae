#!/usr/bin/env bash
# Policy results of every stack for CI: SARIF (code scanning annotations on the stack files) and JUnit
# (test reports), from one `gpuplat check --all` run, and its verdict as the exit code (0 pass, 1 a
# mandatory rule broken, 2 bad input: a stack file that does not load is that stack's error in both
# reports, the other stacks keep their results). The reports are written whole or not at all.
# Usage: scripts/ci/policy-report.sh [OUTPUT_DIR] [POLICY_CONFIG]
set -euo pipefail
out=${1:-policy-report}
config=${2:-}
gpuplat=${GPUPLAT:-gpuplat}
mkdir -p "$out"
args=(check --all --sarif "$out/gpuplat.sarif" --junit "$out/gpuplat-junit.xml")
if [ -n "$config" ]; then
    args+=(--policy-config "$config")
fi
verdict=0
"$gpuplat" "${args[@]}" >&2 || verdict=$?
for report in "$out/gpuplat.sarif" "$out/gpuplat-junit.xml"; do
    if [ ! -s "$report" ]; then
        echo "policy-report.sh: no ${report} (gpuplat exited ${verdict} before checking any stack)" >&2
    fi
done
echo "policy-report.sh: wrote $out/gpuplat.sarif and $out/gpuplat-junit.xml (verdict $verdict)" >&2
exit "$verdict"
