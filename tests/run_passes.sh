#!/usr/bin/env bash
# `make test`'s test run: the suite's two passes (tests/conftest.py says why there are
# two), started together. Usage: tests/run_passes.sh VENV [pytest args for both passes]
#
# Together, not one after the other: the second pass alone keeps only ~1.1 of 2 cores
# busy (its processes wait on one another). Clean-clone runs on one afternoon's core:
# 2,838 s together against 3,061 s one after the other, the same ~4,480 CPU-seconds
# (bench/README.md, "The CI itself"). Each pass has a base temporary folder of its own
# (pytest's numbered ones are pruned by the next session, which would be the other
# pass). The second pass's output is printed after the first pass's, whole, so neither
# log is interleaved; the exit is non-zero if either failed.
set -uo pipefail
venv=$1
shift
base=$(mktemp -d "${TMPDIR:-/tmp}/vfops-tests.XXXXXX")
second_log="$base/torch-pass.log"
cleanup() {
  [ -n "${second_pid:-}" ] && kill -- "$second_pid" 2>/dev/null
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$venv/bin/pytest" -m second_pass --durations=30 --basetemp="$base/second" "$@" \
  >"$second_log" 2>&1 &
second_pid=$!

"$venv/bin/pytest" -n 2 --dist loadfile -m 'not second_pass' --durations=30 \
  --basetemp="$base/main" "$@"
first=$?

wait "$second_pid"
second=$?
second_pid=
echo
echo "===== second pass (pytest -m second_pass, run beside the pass above) ====="
cat "$second_log"
if [ "$first" -ne 0 ] || [ "$second" -ne 0 ]; then
  echo "tests: first pass exit $first, second pass exit $second" >&2
  exit 1
fi
