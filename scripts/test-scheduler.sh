#!/usr/bin/env bash
# The scheduler's multi-node test: the Molecule scenario slurm_cluster (a Slurm controller
# with slurmdbd/MariaDB and two compute nodes with simulated GPUs, on their own podman
# network), on every supported Debian release: create, converge, idempotence, check mode,
# verify (partitions, accounts, a GPU job, real-node settings, quotas, spot preemption with
# grace period + requeue, health-check drain, node failure + requeue), destroy.
#
# Debian 12 (bookworm, Slurm 22.05) runs the full sequence. Debian 13 (trixie, Slurm 24.11)
# runs create, converge and verify: that the roles install and run Slurm 24.11 there. Check mode
# and idempotence are second and third passes of the same roles over a converged cluster; they
# exercise the roles' logic more than the release, and make test cannot pay for them twice within
# its budget (each is a full play over three nodes, ~3-4 minutes on the 2-core CI machine).
# Exits non-zero on failure; the last line is `N passed, M failed` (one per suite and stage).
#
#   scripts/test-scheduler.sh               (as root; about 20 minutes on 2 cores)
#   GPUPLAT_SCHEDULER_SUITES=trixie scripts/test-scheduler.sh    (one release only)
#
# Needs podman/runc (scripts/setup-host.sh) and the venv with the ansible extra; builds the
# base images (scripts/build-base-image.sh SUITE) when they are missing.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
SCENARIO=slurm_cluster
read -r -a SUITES <<<"${GPUPLAT_SCHEDULER_SUITES:-bookworm trixie}"
FULL_STAGES=(create prepare converge idempotence check verify)
SHORT_STAGES=(create prepare converge verify)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
export PATH="$VENV/bin:$PATH"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1

summary() { echo "$1 passed, $2 failed"; }
stages_of() { if [[ $1 == bookworm ]]; then echo "${FULL_STAGES[@]}"; else echo "${SHORT_STAGES[@]}"; fi; }
all_stages=0
for suite in "${SUITES[@]}"; do
  read -r -a s <<<"$(stages_of "$suite")"
  all_stages=$((all_stages + ${#s[@]}))
done

if ! command -v molecule >/dev/null; then
  echo "test-scheduler.sh: molecule not found in $VENV (run: $VENV/bin/pip install -e '.[dev,ansible]')" >&2
  summary 0 "$all_stages"
  exit 1
fi
if ! command -v podman >/dev/null; then
  echo "test-scheduler.sh: podman not found (run scripts/setup-host.sh as root)" >&2
  summary 0 "$all_stages"
  exit 1
fi

cd "$ROOT" || exit 1
passed=0
failed=0
overall_rc=0
for suite in "${SUITES[@]}"; do
  read -r -a stages <<<"$(stages_of "$suite")"
  if ! "$HERE/build-base-image.sh" "$suite"; then
    echo "FAIL $suite: base image"
    failed=$((failed + ${#stages[@]}))
    overall_rc=1
    continue
  fi
  export GPUPLAT_TEST_SUITE=$suite
  log=$(mktemp "/tmp/test-scheduler.$suite.XXXXXX.log")
  start=$SECONDS
  if [[ $suite == bookworm ]]; then
    molecule test -s "$SCENARIO" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    # The same sequence as molecule.yml's test_sequence, without check and idempotence; stop at
    # the first failure and always destroy.
    rc=0
    for action in destroy create prepare converge verify; do
      molecule "$action" -s "$SCENARIO" 2>&1 | tee -a "$log"
      rc=${PIPESTATUS[0]}
      ((rc == 0)) || break
    done
    molecule destroy -s "$SCENARIO" 2>&1 | tee -a "$log" >/dev/null
  fi
  elapsed=$((SECONDS - start))
  suite_failed=0
  for stage in "${stages[@]}"; do
    if grep -Eq "($SCENARIO ➜ $stage: |\[$SCENARIO > $stage\] )Executed: Successful" "$log"; then
      echo "PASS $suite $stage"
      passed=$((passed + 1))
    else
      echo "FAIL $suite $stage"
      failed=$((failed + 1))
      suite_failed=$((suite_failed + 1))
    fi
  done
  ((rc != 0 && suite_failed == 0)) && failed=$((failed + 1))
  ((rc != 0 || suite_failed != 0)) && overall_rc=1
  echo "molecule $SCENARIO on $suite: rc=$rc in ${elapsed}s (log: $log)"
done
summary "$passed" "$failed"
((overall_rc == 0 && failed == 0))
