#!/usr/bin/env bash
# The setup the real-node benchmarks share (`make bench-ha`, `make bench-autogrow`), sourced by
# them: builds what the image ships (`make static`) and the operator, brings the test bed up
# with its real node unless it is up already, and loads dbop's image. `bench_run CMD...` runs
# the benchmark's command; `bench_finish` takes the test bed down again if it was started here
# and exits with the first failure's status.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export DBOP_TESTBED_DIR="${DBOP_TESTBED_DIR:-$PWD/.testbed}"
export KUBECONFIG="$DBOP_TESTBED_DIR/kubeconfig"
make --no-print-directory static
cargo build --locked -p dbop --bins
bench_started_here=
if [ ! -f "$DBOP_TESTBED_DIR/ready" ]; then
  bench_started_here=1
  make --no-print-directory testbed-up
fi
bench_status=0
DBOP_IMAGE_BIN_DIR="$PWD/target/x86_64-unknown-linux-musl/release:$PWD/target/debug" \
  e2e/testbed/dbop-image.sh dev || bench_status=$?

# Runs "$@" unless an earlier step failed; a failure is kept for bench_finish.
bench_run() {
  [ "$bench_status" = 0 ] || return 0
  "$@" || bench_status=$?
}

bench_finish() {
  if [ -n "$bench_started_here" ]; then make --no-print-directory testbed-down || bench_status=$?; fi
  exit "$bench_status"
}
