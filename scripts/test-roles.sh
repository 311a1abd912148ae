#!/usr/bin/env bash
# Test the node software roles offline: build the base image and the fixture
# repository, lint roles/ and playbooks/ (ansible-lint, production profile), then
# run every Molecule scenario (converge, idempotence, check mode, verify, destroy):
#
#   gpu_stack        gpu_driver, fabric_manager, cuda_toolkit, rdma (EFA), nccl,
#                    container_runtime, dcgm via playbooks/gpu_nodes.yml, on an instance
#                    with no network: everything comes from the fixture mirror on loopback;
#                    then, on that node, the refusals: an image's own driver or EFA stack, a
#                    fabric manager version other than the driver's (clear message, nothing installed)
#
# Then node_base on Debian 13 (trixie), the second supported Debian release: playbooks/site.yml on
# a simulated-GPU InfiniBand node (node_exporter and rdma from Debian's archive, every GPU role
# skips and leaves nothing behind), converged, converged again with no change, verified
# (GPUPLAT_TEST_SUITE selects the base image; see molecule/shared/create.yml). On Debian 12 the
# integration tier's local platform runs the same site.yml on simulated-GPU nodes, converges it a
# second time with no change (`up --reconfigure`) and runs jobs on it; `scripts/test-roles.sh
# node_base` runs the scenario there too.
#
#   scripts/test-roles.sh [scenario ...]     (default: all, then node_base on trixie)
#
# Needs: scripts/setup-host.sh (as root) and `.venv/bin/pip install -e '.[dev,ansible]'`.
# Prints `N passed, M failed` last and exits non-zero if anything failed.
# Logs: build/test-roles/<step>.log
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SUITE=test-roles
# shellcheck source=scripts/lib/test-steps.sh
source "$ROOT/scripts/lib/test-steps.sh"
ALL_SCENARIOS=(gpu_stack)
TRIXIE_SCENARIOS=(node_base)
SCENARIOS=("${@:-${ALL_SCENARIOS[@]}}")
require_tools podman debootstrap apt-ftparchive molecule ansible-lint

ready=1
run_step base-image scripts/build-base-image.sh || ready=0
run_step fixture-repo python3 scripts/build-fixture-repo.py || ready=0
run_step ansible-lint ansible-lint --profile production roles/ playbooks/

for scenario in "${SCENARIOS[@]}"; do
  if ((ready)); then
    run_step "molecule:$scenario" molecule test -s "$scenario"
  else
    skip_step "molecule:$scenario" "base image or fixture repository missing"
  fi
done

# On Debian 13: create, converge, converge again with no change, verify.
converge_and_verify() {
  local suite=$1 scenario=$2 rc=0 action
  for action in destroy create prepare converge idempotence verify; do
    GPUPLAT_TEST_SUITE=$suite molecule "$action" -s "$scenario" || { rc=$?; break; }
  done
  GPUPLAT_TEST_SUITE=$suite molecule destroy -s "$scenario" >/dev/null 2>&1
  return "$rc"
}

if (($# == 0)); then
  if run_step base-image:trixie scripts/build-base-image.sh trixie; then
    for scenario in "${TRIXIE_SCENARIOS[@]}"; do
      run_step "molecule:$scenario@trixie" converge_and_verify trixie "$scenario"
    done
  else
    for scenario in "${TRIXIE_SCENARIOS[@]}"; do
      skip_step "molecule:$scenario@trixie" "Debian 13 base image missing"
    done
  fi
fi

finish_steps
