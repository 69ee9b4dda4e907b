#!/usr/bin/env bash
# `make bench-ha`: failover, switchover and minor upgrades of 3-instance Databases on the test
# bed's real node (e2e/examples/bench_ha.rs), after the shared setup of e2e/bench/real-node.sh
# (and the test bed down again afterwards, unless it was already up); its figures go to stdout
# and target/bench/ha-$BENCH_LABEL.json.
#
# Env: BENCH_HA_TRIALS (20 per fault kind), BENCH_HA_UPGRADES (5 minor upgrades), BENCH_HA_KINDS,
# BENCH_HA_SYNCHRONOUS=1, BENCH_LABEL.
source "$(dirname "${BASH_SOURCE[0]}")/real-node.sh"
bench_run cargo build --locked -p dbop-e2e --example bench_ha
bench_run cargo run -q --locked -p dbop-e2e --example bench_ha
bench_finish
