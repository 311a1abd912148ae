#!/usr/bin/env bash
# The scheduler's multi-node test: `molecule test -s slurm_cluster` (a Slurm controller
# with slurmdbd/MariaDB and two compute nodes with simulated GPUs, on their own podman
# network): create, converge, idempotence, check mode, verify (partitions, accounts,
# a GPU job, quotas, spot preemption + requeue, health-check drain, node failure +
# requeue), destroy. Exits non-zero on failure; the last line is `N passed, M failed`
# (one per stage below).
#
#   scripts/test-scheduler.sh            (as root; about 9-10 minutes on 2 cores)
#
# Needs podman/runc (scripts/setup-host.sh) and the venv with the ansible extra.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
SCENARIO=slurm_cluster
STAGES=(create prepare converge idempotence check verify)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
export PATH="$VENV/bin:$PATH"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1

summary() { echo "$1 passed, $2 failed"; }

if ! command -v molecule >/dev/null; then
  echo "test-scheduler.sh: molecule not found in $VENV (run: $VENV/bin/pip install -e '.[dev,ansible]')" >&2
  summary 0 ${#STAGES[@]}
  exit 1
fi
if ! command -v podman >/dev/null; then
  echo "test-scheduler.sh: podman not found (run scripts/setup-host.sh as root)" >&2
  summary 0 ${#STAGES[@]}
  exit 1
fi
"$HERE/build-base-image.sh" || { summary 0 ${#STAGES[@]}; exit 1; }

log=$(mktemp /tmp/test-scheduler.XXXXXX.log)
start=$SECONDS
cd "$ROOT" || exit 1
molecule test -s "$SCENARIO" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
elapsed=$((SECONDS - start))

passed=0
failed=0
for stage in "${STAGES[@]}"; do
  if grep -Eq "($SCENARIO ➜ $stage: |\[$SCENARIO > $stage\] )Executed: Successful" "$log"; then
    echo "PASS $stage"
    passed=$((passed + 1))
  else
    echo "FAIL $stage"
    failed=$((failed + 1))
  fi
done
((rc != 0 && failed == 0)) && failed=1
echo "molecule test -s $SCENARIO: rc=$rc in ${elapsed}s (log: $log)"
summary "$passed" "$failed"
((rc == 0 && failed == 0))
