#!/usr/bin/env bash
# Test the serving stack offline: lint its roles and playbook (ansible-lint, production
# profile), then run the Molecule scenario molecule/serving: a service node (HAProxy
# gateway + Prometheus) and an infer node (CPU reference model server) converge
# playbooks/serving.yml, converge again with no change, pass check mode, and verify:
# health, real embeddings through the gateway with the official openai client, the
# overload burst (503 at once past the queue, every accepted request complete), and
# Prometheus targets, recording rules and recorded series.
#
#   scripts/test-serving.sh
#
# Needs: scripts/setup-host.sh (as root) and `.venv/bin/pip install -e '.[dev,ansible]'`;
# the base image is built by scripts/build-base-image.sh if missing. The nodes install
# haproxy and prometheus from Debian's archive and the model server from PyPI.
# Prints `N passed, M failed` last and exits non-zero if anything failed.
# Logs: build/test-serving/<step>.log
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-$ROOT/.venv}
export PATH="$VENV/bin:$PATH"
export CONTAINERS_CONF="$ROOT/scripts/containers.conf"
export ANSIBLE_NOCOLOR=1 NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0
LOGS=$ROOT/build/test-serving
mkdir -p "$LOGS"

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
command -v molecule >/dev/null || missing+=("molecule (run $VENV/bin/pip install -e '.[dev,ansible]')")
command -v ansible-lint >/dev/null || missing+=("ansible-lint (run $VENV/bin/pip install -e '.[dev,ansible]')")
if ((${#missing[@]})); then
  printf 'test-serving.sh: missing %s\n' "${missing[@]}" >&2
  echo "0 passed, 1 failed"
  exit 2
fi

total_start=$SECONDS
ready=1
if ! podman image exists localhost/gpuplat-base:bookworm; then
  run_step base-image scripts/build-base-image.sh || ready=0
fi
run_step ansible-lint ansible-lint --profile production \
  roles/inference_server roles/inference_gateway roles/monitoring playbooks/serving.yml

if ((ready)); then
  run_step molecule:serving molecule test -s serving
else
  failed=$((failed + 1))
  failures+=("molecule:serving (not run: no base image)")
  printf '%-40s SKIP  (no base image)\n' "molecule:serving"
fi

echo
echo "serving tests took $((SECONDS - total_start))s"
((failed)) && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
