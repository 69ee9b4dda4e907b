#!/usr/bin/env bash
# timed.sh NAME CMD...: runs CMD, then appends "NAME<TAB>seconds" to $DBOP_TIMES (when set) and
# exits with CMD's status. `make test` and `.ci/run` time their steps with it; e2e/times.sh prints
# the table.
set -uo pipefail
name=$1; shift
start=$(date +%s)
"$@"
status=$?
if [[ -n "${DBOP_TIMES:-}" ]]; then
  printf '%s\t%s\n' "$name" "$(($(date +%s) - start))" >>"$DBOP_TIMES"
fi
exit "$status"
