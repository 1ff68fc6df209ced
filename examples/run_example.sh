#!/bin/sh
# Runs an example for CTest: passes when the program exits 0 and prints a
# line containing the expected text (its agreement line). CTest's
# PASS_REGULAR_EXPRESSION alone would ignore the exit status. Any other
# status, 77 (skip) included, is passed through.
#   sh run_example.sh EXPECTED PROGRAM [ARGS...]
expect=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "run_example: $1 exited with status $rc"
  exit "$rc"
fi
if ! printf '%s\n' "$out" | grep -q -F -- "$expect"; then
  echo "run_example: $1 exited 0 but printed no line with '$expect'"
  exit 1
fi
