#!/usr/bin/env bash
# `make bench-autogrow`: how long dbop takes to ask for a larger volume once a Database's data
# volume crosses its autoGrow threshold, on the test bed's real node (the `autogrow` e2e test
# that grows a 256Mi tmpfs volume twice; it prints both reaction times), after the shared setup
# of e2e/bench/real-node.sh (and the test bed down again afterwards, unless it was already up):
# the test BENCH_AUTOGROW_RUNS times (default 3), then the machine's load.
source "$(dirname "${BASH_SOURCE[0]}")/real-node.sh"

reaction_times() {
  cargo test -q --locked -p dbop-e2e --test autogrow a_volume_grows_before_it_fills -- --nocapture 2>&1 \
    | grep '^autogrow: reaction'
}

for _ in $(seq "${BENCH_AUTOGROW_RUNS:-3}"); do bench_run reaction_times; done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
bench_finish
