#!/usr/bin/env bash
# A/B of the operator's restart on a populated bed: each binary given is started alone
# (`dbop run`, RUST_LOG=warn, no request budget), VmRSS read every second for SECONDS_EACH (60)
# s, then its CPU seconds (utime + stime) and the reconciles it ran; the binaries interleaved,
# ROUNDS rounds.
#
#   KUBECONFIG=/path/to/bed/kubeconfig e2e/bench/restart-ab.sh BIN_A BIN_B ...
#
# The bed: `make bench`'s scale phase on a kwok-only test bed of its own (docs/benchmarks.md,
# "Only the identity decoded"). Nothing else should run meanwhile.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
: "${KUBECONFIG:?set KUBECONFIG to the bed of the benchmark}"
export RUST_LOG=warn DBOP_API_QPS=0
ticks=$(getconf CLK_TCK)
seconds=${SECONDS_EACH:-60}
quarter=$((seconds >= 4 ? seconds / 4 : 1))
port=${METRICS_PORT:-19192}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bin in "$@"; do
    "$bin" run --metrics-addr "127.0.0.1:$port" >/dev/null 2>&1 &
    pid=$!
    peak=0 samples=""
    for t in $(seq 1 "$seconds"); do
      sleep 1
      rss=$(awk '/VmRSS/{print $2}' "/proc/$pid/status")
      [ "$rss" -gt "$peak" ] && peak=$rss
      if [ $((t % quarter)) -eq 0 ]; then samples="$samples ${t}s=$((rss / 1024))"; fi
    done
    read -r utime stime < <(awk '{print $14, $15}' "/proc/$pid/stat")
    reconciles=$({ curl -s "127.0.0.1:$port/metrics" || true; } |
      awk '/^dbop_reconciles_total\{controller="database"\}/{print $2}')
    cpu=$(awk -v t="$((utime + stime))" -v hz="$ticks" 'BEGIN { printf "%.1f", t / hz }')
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    printf 'round %s %s: RSS MiB%s peak=%s cpu_s=%s reconciles=%s load=%s\n' \
      "$round" "$bin" "$samples" "$((peak / 1024))" "$cpu" "${reconciles:-?}" "$load"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
