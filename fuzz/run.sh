#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (FUZZ_SECONDS each, default 60) from the
# checked-in seeds plus the local corpus, and prints one line per target: runs, time, crashes.
# Built optimised with debug assertions and overflow checks on (-O -a), so an overflow is a
# crash. Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"manifest termination_message units archive"}
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2; exit 1; }
cargo +nightly fuzz build -O -a >/dev/null
status=0
summary=()
for t in $targets; do
  mkdir -p "corpus/$t" "artifacts/$t"
  log=$(mktemp)
  if cargo +nightly fuzz run -O -a "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    outcome=ok
  else
    outcome=CRASH; status=1
    tail -40 "$log"
  fi
  runs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 || true)
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  crashes=$(find "artifacts/$t" -type f | wc -l)
  corpus=$(find "corpus/$t" -type f | wc -l)
  summary+=("$t: $outcome, ${execs} execs in ${seconds}s (${runs:-no final line}), corpus ${corpus}, artifacts ${crashes}")
  rm -f "$log"
done
printf '%s\n' "${summary[@]}"
exit $status
