#!/usr/bin/env bash
# `make bench-ha`: failover and switchover of a 3-instance Database on the test bed's real node
# (e2e/examples/bench_ha.rs). Builds the binaries the image ships (`make static`) and the
# operator, brings the test bed up with its real node (and down again afterwards, unless it was
# already up), loads dbop's image, and runs the benchmark; its figures go to stdout and
# target/bench/ha-$BENCH_LABEL.json.
#
# Env: BENCH_HA_TRIALS (20 per kind), BENCH_HA_KINDS, BENCH_HA_SYNCHRONOUS=1, BENCH_LABEL.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export DBOP_TESTBED_DIR="${DBOP_TESTBED_DIR:-$PWD/.testbed}"
make --no-print-directory static
cargo build --locked -p dbop --bins
cargo build --locked -p dbop-e2e --example bench_ha
started_here=
if [ ! -f "$DBOP_TESTBED_DIR/ready" ]; then
  started_here=1
  make --no-print-directory testbed-up
fi
status=0
DBOP_IMAGE_BIN_DIR="$PWD/target/x86_64-unknown-linux-musl/release:$PWD/target/debug" \
  e2e/testbed/dbop-image.sh dev || status=$?
if [ $status = 0 ]; then
  KUBECONFIG="$DBOP_TESTBED_DIR/kubeconfig" cargo run -q --locked -p dbop-e2e --example bench_ha || status=$?
fi
if [ -n "$started_here" ]; then make --no-print-directory testbed-down || status=$?; fi
exit $status
