#!/usr/bin/env bash
# times.sh FILE TITLE WALL_SECONDS [BUDGET_SECONDS]: prints the steps timed into FILE
# (e2e/timed.sh; the e2e runner adds an "e2e <suite>" line per suite), slowest first, then the
# wall time. Suites run side by side, so their times overlap and add up to more than the wall.
# With a budget, says whether the wall time stayed within it — a warning, not a failure: these
# machines are shared, so a slow run is a reason to look at the table, not a verdict.
set -euo pipefail
file=$1 title=$2 wall=$3 budget=${4:-}
echo
echo "::: $title: where the time went, slowest first (seconds)"
if [[ -s "$file" ]]; then
  sort -t $'\t' -k2,2nr "$file" | awk -F '\t' '{ printf "  %6d  %s\n", $2, $1 }'
  awk -F '\t' '$1 ~ /^e2e / { s += $2; n++ } END { if (n) printf "  (%d e2e suites: %d s of suite time, run side by side)\n", n, s }' "$file"
else
  echo "  nothing was timed ($file is empty)"
fi
echo "  wall: $wall s"
if [[ -n "$budget" ]]; then
  if ((wall > budget)); then
    echo "::: BUDGET EXCEEDED: $title took $wall s, over its budget of $budget s: see which step grew above"
  else
    echo "::: $title took $wall s, within its budget of $budget s"
  fi
fi
