#!/usr/bin/env bash
# make test's four streams, side by side, each a chain of make targets run one after the other:
#
#   scripts/test-streams.sh 'test-box' 'test-integration' 'test-roles lint test-unit test-processes' 'test-scheduler test-serving'
#
# Each stream is its own make (no shared jobserver: a token a child takes and never gives back cannot
# hold the others up), starts at once, writes build/test-streams/<first target>.log, and is printed
# whole when it ends, with when it started and ended (seconds since this script started). A stream
# stops at its first failing target. Prints a table of the streams last; exits 1 if any failed.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOGS=$ROOT/build/test-streams
mkdir -p "$LOGS"
# The streams are independent makes, not sub-makes of the make that runs this script.
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES

declare -A name_of started ended status
pids=()

run_stream() {
  local target
  for target in "$@"; do
    echo "== make $target (+$SECONDS s)"
    make --no-print-directory -C "$ROOT" "$target" || return 1
  done
}

for stream in "$@"; do
  read -ra targets <<<"$stream"
  name=${targets[0]}
  run_stream "${targets[@]}" >"$LOGS/$name.log" 2>&1 &
  pids+=("$!")
  name_of[$!]=$name
  started[$name]=$SECONDS
  echo "stream $name started (+$SECONDS s): ${targets[*]}"
done

failed=0
for _ in "${pids[@]}"; do
  wait -n -p pid
  rc=$?
  name=${name_of[$pid]}
  ended[$name]=$SECONDS
  status[$name]=$([[ $rc == 0 ]] && echo PASS || echo FAIL)
  ((rc == 0)) || failed=1
  echo
  echo "======== stream $name: ${status[$name]} (+${started[$name]} s to +${ended[$name]} s) ========"
  cat "$LOGS/$name.log"
done

echo
printf '%-20s %-6s %8s %8s %8s\n' stream result start_s end_s took_s
for stream in "$@"; do
  read -ra targets <<<"$stream"
  name=${targets[0]}
  printf '%-20s %-6s %8d %8d %8d\n' "$name" "${status[$name]}" "${started[$name]}" "${ended[$name]}" \
    $((ended[$name] - started[$name]))
done
exit $failed
