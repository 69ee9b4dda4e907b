#!/usr/bin/env bash
# `make bench-autogrow`: how long dbop takes to ask for a larger volume once a Database's data
# volume crosses its autoGrow threshold, on the test bed's real node (the `autogrow` e2e test
# that grows a 256Mi tmpfs volume twice; it prints both reaction times). Builds what the image
# ships and the operator, brings the test bed up (and down again afterwards, unless it was
# already up), loads dbop's image, runs the test BENCH_AUTOGROW_RUNS times (default 3), then
# prints the machine's load.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export DBOP_TESTBED_DIR="${DBOP_TESTBED_DIR:-$PWD/.testbed}"
make --no-print-directory static
cargo build --locked -p dbop --bins
started_here=
if [ ! -f "$DBOP_TESTBED_DIR/ready" ]; then
  started_here=1
  make --no-print-directory testbed-up
fi
status=0
DBOP_IMAGE_BIN_DIR="$PWD/target/x86_64-unknown-linux-musl/release:$PWD/target/debug" \
  e2e/testbed/dbop-image.sh dev || status=$?
for _ in $(seq "${BENCH_AUTOGROW_RUNS:-3}"); do
  [ $status = 0 ] || break
  KUBECONFIG="$DBOP_TESTBED_DIR/kubeconfig" cargo test -q --locked -p dbop-e2e --test autogrow \
    a_volume_grows_before_it_fills -- --nocapture 2>&1 | grep '^autogrow: reaction' || status=$?
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$started_here" ]; then make --no-print-directory testbed-down || status=$?; fi
exit $status
