# Shared by the scripts that run Molecule scenarios (test-roles.sh, test-serving.sh): the environment,
# one logged and timed step at a time, the prerequisite check and the closing `N passed, M failed`.
# Source it after setting ROOT and SUITE (the log folder's name under build/).

VENV=${VENV:-$ROOT/.venv}
export PATH="$VENV/bin:$PATH"
export CONTAINERS_CONF="$ROOT/scripts/containers.conf"
export ANSIBLE_NOCOLOR=1 NO_COLOR=1 PY_COLORS=0 ANSIBLE_FORCE_COLOR=0
# shellcheck source=scripts/lib/molecule-mitogen.sh
source "$ROOT/scripts/lib/molecule-mitogen.sh"
LOGS=$ROOT/build/$SUITE
mkdir -p "$LOGS"

passed=0
failed=0
failures=()
total_start=$SECONDS

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

skip_step() {
  failed=$((failed + 1))
  failures+=("$1 (not run: $2)")
  printf '%-40s SKIP  (%s)\n' "$1" "$2"
}

# require_tools TOOL...: exit with a failed summary naming what to install.
require_tools() {
  local missing=() tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null && continue
    case $tool in
      molecule | ansible-lint) missing+=("$tool (run $VENV/bin/pip install -e '.[dev,ansible]')") ;;
      *) missing+=("$tool (run scripts/setup-host.sh as root)") ;;
    esac
  done
  if ((${#missing[@]})); then
    printf '%s: missing %s\n' "$SUITE" "${missing[@]}" >&2
    echo "0 passed, 1 failed"
    exit 2
  fi
}

finish_steps() {
  echo
  echo "$SUITE took $((SECONDS - total_start))s"
  ((failed)) && printf 'failed: %s\n' "${failures[@]}"
  echo "$passed passed, $failed failed"
  ((failed == 0))
}
