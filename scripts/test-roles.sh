#!/usr/bin/env bash
# Test the node software roles offline: build the base image and the fixture
# repository, lint roles/ and playbooks/ (ansible-lint, production profile), then
# run every Molecule scenario (converge, idempotence, check mode, verify, destroy):
#
#   gpu_stack        gpu_driver, fabric_manager, cuda_toolkit, rdma (EFA), nccl,
#                    container_runtime, dcgm via playbooks/gpu_nodes.yml, on an instance
#                    with no network: everything comes from the fixture mirror on loopback
#   node_base        playbooks/site.yml on a simulated-GPU InfiniBand node: node_exporter and
#                    rdma from Debian's archive, every GPU role skips and leaves nothing behind
#   fm_version_skew  negative test: fabric manager != driver version fails with a clear message
#
#   scripts/test-roles.sh [scenario ...]     (default: all)
#
# Needs: scripts/setup-host.sh (as root) and `.venv/bin/pip install -e '.[dev,ansible]'`.
# Prints `N passed, M failed` last and exits non-zero if anything failed.
# Logs: build/test-roles/<step>.log
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-$ROOT/.venv}
export PATH="$VENV/bin:$PATH"
export CONTAINERS_CONF="$ROOT/scripts/containers.conf"
export ANSIBLE_NOCOLOR=1 NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0
LOGS=$ROOT/build/test-roles
mkdir -p "$LOGS"

ALL_SCENARIOS=(gpu_stack node_base fm_version_skew)
SCENARIOS=("${@:-${ALL_SCENARIOS[@]}}")

passed=0
failed=0
failures=()

run_step() {
  local name=$1
  shift
  local log="$LOGS/${name//[^A-Za-z0-9_.-]/_}.log"
  local start=$SECONDS
  printf '%-40s ' "$name"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    printf 'PASS  (%ds)\n' $((SECONDS - start))
    return 0
  fi
  failed=$((failed + 1))
  failures+=("$name")
  printf 'FAIL  (%ds)  log: %s\n' $((SECONDS - start)) "${log#"$ROOT"/}"
  tail -n 40 "$log" | sed 's/^/    | /'
  return 1
}

missing=()
command -v podman >/dev/null || missing+=("podman (run scripts/setup-host.sh as root)")
command -v debootstrap >/dev/null || missing+=("debootstrap (run scripts/setup-host.sh as root)")
command -v apt-ftparchive >/dev/null || missing+=("apt-ftparchive (run scripts/setup-host.sh as root)")
command -v molecule >/dev/null || missing+=("molecule (run $VENV/bin/pip install -e '.[dev,ansible]')")
command -v ansible-lint >/dev/null || missing+=("ansible-lint (run $VENV/bin/pip install -e '.[dev,ansible]')")
if ((${#missing[@]})); then
  printf 'test-roles.sh: missing %s\n' "${missing[@]}" >&2
  echo "0 passed, 1 failed"
  exit 2
fi

total_start=$SECONDS
ready=1
run_step base-image scripts/build-base-image.sh || ready=0
run_step fixture-repo python3 scripts/build-fixture-repo.py || ready=0
run_step ansible-lint ansible-lint --profile production roles/ playbooks/

for scenario in "${SCENARIOS[@]}"; do
  if ((ready)); then
    run_step "molecule:$scenario" molecule test -s "$scenario"
  else
    failed=$((failed + 1))
    failures+=("molecule:$scenario (not run: base image or fixture repository missing)")
    printf '%-40s SKIP  (no base image or fixture repository)\n' "molecule:$scenario"
  fi
done

echo
echo "role tests took $((SECONDS - total_start))s"
((failed)) && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
