#!/usr/bin/env bash
# unit-tests.sh [ARGS]: `make test-unit`'s runner for the workspace's tests that need no cluster.
# `cargo test` runs a workspace's test binaries one after another, and most of ours spend their
# time waiting on PostgreSQL, an S3 server or a timeout they provoke rather than on the CPU. Here
# the binaries run UNIT_JOBS at a time (default 3), longest first by the times of their last
# run here (target/unit-test-times.tsv; on a fresh clone, those in scripts/unit-test-times.tsv),
# each in its package's directory with the variables cargo gives it, its output kept whole and
# printed when it ends. The run fails when a binary fails, and names each failed one at the end.
# ARGS go to every test binary (a filter, `--nocapture`, …); a run with ARGS records no times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
jobs=${UNIT_JOBS:-3}
cargo=${CARGO:-cargo}
times=${CARGO_TARGET_DIR:-$root/target}/unit-test-times.tsv
known_times=$times
[[ -f $known_times ]] || known_times=$root/scripts/unit-test-times.tsv
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Build every test binary (cargo prints its usual progress), then list them: executable, package
# directory, target kind and name, and the package's folder ("dbop" for the root).
"$cargo" test --locked --workspace --exclude dbop-e2e --no-run --message-format=json-render-diagnostics |
  jq -r --arg root "$root" '
    select(.reason == "compiler-artifact" and .profile.test and .executable != null)
    | (.manifest_path | sub("/Cargo.toml$"; "")) as $dir
    | ($dir | ltrimstr($root) | ltrimstr("/")) as $rel
    | [.executable, $dir, .target.kind[0], .target.name, (if $rel == "" then "dbop" else $rel end)]
    | @tsv' >"$work/binaries.tsv"
[[ -s $work/binaries.tsv ]] || { echo "unit-tests.sh: cargo listed no test binary" >&2; exit 1; }

# Longest first by the last run's times; a binary never timed counts as the longest.
while IFS=$'\t' read -r exe dir kind target place; do
  name="$place $kind $target"
  last=$(awk -F'\t' -v n="$name" '$1 == n { t = $2 } END { if (t != "") print t }' "$known_times" 2>/dev/null || true)
  printf '%s\t%s\t%s\t%s\n' "${last:-999999}" "$name" "$exe" "$dir"
done <"$work/binaries.tsv" | sort -t$'\t' -k1,1nr >"$work/queue.tsv"

declare -A running=() started=()
failed=()
finish() { # prints a finished binary's output, records its time and its status
  local pid=$1 status=$2 index=${running[$1]} name took
  took=$(($(date +%s) - ${started[$1]}))
  name=$(sed -n "${index}p" "$work/queue.tsv" | cut -f2)
  echo "──── $name: $([[ $status == 0 ]] && echo ok || echo "FAILED (status $status)") in $took s"
  cat "$work/$index.log"
  printf '%s\t%s\n' "$name" "$took" >>"$work/times.tsv"
  [[ $status == 0 ]] || failed+=("$name")
  unset "running[$pid]"
}
wait_one() {
  local status=0 pid
  wait -n -p pid "${!running[@]}" || status=$?
  finish "$pid" "$status"
}
index=0
while IFS=$'\t' read -r _ _ exe dir; do
  index=$((index + 1))
  while ((${#running[@]} >= jobs)); do wait_one; done
  (cd "$dir" && CARGO_MANIFEST_DIR=$dir exec "$exe" "$@") </dev/null >"$work/$index.log" 2>&1 &
  running[$!]=$index
  started[$!]=$(date +%s)
done <"$work/queue.tsv"
while ((${#running[@]} > 0)); do wait_one; done
(($# > 0)) || cp "$work/times.tsv" "$times"

# The doc tests: rustdoc compiles them, so cargo runs them.
"$cargo" test --locked --workspace --exclude dbop-e2e --doc || failed+=("doc tests")

if ((${#failed[@]} > 0)); then
  printf 'unit tests FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "unit tests: $(wc -l <"$work/queue.tsv") test binaries and the doc tests passed, $jobs at a time"
