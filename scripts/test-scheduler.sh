#!/usr/bin/env bash
# The scheduler's multi-node test: the Molecule scenario slurm_cluster (a Slurm controller
# with slurmdbd/MariaDB and two compute nodes with simulated GPUs, on their own podman
# network): create, converge, verify (partitions, accounts, a GPU job, real-node settings,
# quotas, spot preemption with grace period + requeue, health-check drain, node failure +
# requeue), destroy.
#
# make test runs it on Debian 13 (trixie, Slurm 24.11) only. Debian 12 (bookworm, Slurm 22.05)
# is the release of the local platform, which make test's integration tier converges with the
# same roles (playbooks/site.yml), converges again with no change, and runs jobs, requeues,
# drains and node joins on; a bookworm run here would converge the same roles a second time.
# The full sequence (idempotence and check mode too) on bookworm, as before:
#
#   scripts/test-scheduler.sh                                   (trixie; about 12 minutes on 2 cores)
#   GPUPLAT_SCHEDULER_SUITES=bookworm scripts/test-scheduler.sh  (full sequence on bookworm)
#   GPUPLAT_SCHEDULER_SUITES="bookworm trixie" scripts/test-scheduler.sh
#
# Exits non-zero on failure; the last line is `N passed, M failed` (one per suite and stage).
# Needs podman/runc (scripts/setup-host.sh) and the venv with the ansible extra; builds the
# base images (scripts/build-base-image.sh SUITE) when they are missing.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
SCENARIO=slurm_cluster
read -r -a SUITES <<<"${GPUPLAT_SCHEDULER_SUITES:-trixie}"
FULL_STAGES=(create prepare converge idempotence check verify)
SHORT_STAGES=(create prepare converge verify)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
export PATH="$VENV/bin:$PATH"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
# shellcheck source=scripts/lib/molecule-mitogen.sh
source "$HERE/lib/molecule-mitogen.sh"

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
