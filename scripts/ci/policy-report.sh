#!/usr/bin/env bash
# Policy results of every stack for CI: SARIF (code scanning annotations on the stack files) and JUnit
# (test reports), and the verdict as the exit code (0 pass, 1 a mandatory rule broken, 2 bad input).
# Usage: scripts/ci/policy-report.sh [OUTPUT_DIR] [POLICY_CONFIG]
set -euo pipefail
out=${1:-policy-report}
config=${2:-}
gpuplat=${GPUPLAT:-gpuplat}
mkdir -p "$out"
args=(check --all)
if [ -n "$config" ]; then
    args+=(--policy-config "$config")
fi
verdict=0
"$gpuplat" "${args[@]}" --format sarif >"$out/gpuplat.sarif" || verdict=$?
"$gpuplat" "${args[@]}" --format junit >"$out/gpuplat-junit.xml" || [ $? -eq "$verdict" ]
"$gpuplat" "${args[@]}" >&2 || true
echo "policy-report.sh: wrote $out/gpuplat.sarif and $out/gpuplat-junit.xml (verdict $verdict)" >&2
exit "$verdict"
