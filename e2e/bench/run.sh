#!/usr/bin/env bash
# `make bench`: the operator at scale (e2e/examples/bench.rs) on a kwok-only test bed of its own.
# Builds `dbop` as the image ships it (`make static`: musl, release; or uses DBOP_BIN), brings the test bed up with enough
# PersistentVolumes for every Database (and down again afterwards, unless it was already up),
# and runs the benchmark; its figures go to stdout and target/bench/operator-$BENCH_LABEL.json.
#
# Env (see e2e/examples/bench.rs): BENCH_DATABASES (1000), BENCH_NAMESPACES (10),
# BENCH_IDLE_SECS (600), BENCH_DELETIONS (1000), BENCH_REPAIR_CONCURRENCY (4),
# BENCH_CONVERGING (= BENCH_DATABASES: new Databases converging during phase 5), BENCH_LABEL,
# DBOP_BIN (default: target/x86_64-unknown-linux-musl/release/dbop, built here).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export DBOP_TESTBED_DIR="${DBOP_TESTBED_DIR:-$PWD/.testbed}"
databases="${BENCH_DATABASES:-1000}"
converging="${BENCH_CONVERGING:-$databases}"
if [ -z "${DBOP_BIN:-}" ]; then
  # What the image ships: the static musl binary (its allocator, not glibc's, sets the RSS).
  make --no-print-directory static
  export DBOP_BIN="$PWD/target/x86_64-unknown-linux-musl/release/dbop"
fi
cargo build -p dbop-e2e --example bench
started_here=
if [ ! -f "$DBOP_TESTBED_DIR/ready" ]; then
  started_here=1
  DBOP_TESTBED_REAL_NODE=0 DBOP_TESTBED_PVS="${DBOP_TESTBED_PVS:-$((2 * databases + converging + 50))}" make --no-print-directory testbed-up
fi
status=0
KUBECONFIG="$DBOP_TESTBED_DIR/kubeconfig" cargo run -q -p dbop-e2e --example bench || status=$?
if [ -n "$started_here" ]; then make --no-print-directory testbed-down || status=$?; fi
exit $status
