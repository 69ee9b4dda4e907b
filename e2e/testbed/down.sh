#!/usr/bin/env bash
# Stops the dbop test bed started by up.sh in ${DBOP_TESTBED_DIR:-<repo>/.testbed}: the recorded
# pids first (kwok, scheduler, controller-manager, apiserver, etcd: TERM, then KILL after 10s),
# then a sweep for any leftover process whose command line names this state directory. Checks that
# none of the recorded ports is still listening, then removes the state (DBOP_TESTBED_KEEP=1 keeps
# the logs and the audit log in $DBOP_TESTBED_DIR/logs). Idempotent.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
if [[ ! -d "$DIR" ]]; then log "nothing to stop: $DIR does not exist"; exit 0; fi
DIR="$(cd "$DIR" && pwd)"
PIDS="$DIR/pids"
if [[ -z "${DBOP_TESTBED_LOCKED:-}" ]]; then # (up.sh calls down.sh holding the lock)
  exec 8>"$DIR/.lock"
  flock 8
fi

# TERM the given pids, wait up to 10s for all of them, then KILL what is left.
stop_pids() { # label pid...
  local label="$1" i alive; shift
  (($# > 0)) || return 0
  log "stopping $label"
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    alive=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    ((${#alive[@]} == 0)) && return 0
    ((i == 100)) && { log "still running after 10s: ${alive[*]}: KILL"; kill -KILL "${alive[@]}" 2>/dev/null || true; }
    sleep 0.1
  done
  log "WARNING: still running: ${alive[*]}"
}
pids_of() { local c f pid; for c in "$@"; do f="$PIDS/$c.pid"; [[ -f "$f" ]] || continue; pid="$(cat "$f")"; kill -0 "$pid" 2>/dev/null && echo "$pid"; done; return 0; }

# The real nodes first, in their own order (they need the API server to drain their pods); the
# second one (second-node.sh) before the first, whose chain and cgroups hold its own.
DBOP_TESTBED_DIR="$DIR" "$TESTBED_SRC/second-node.sh" down
DBOP_TESTBED_DIR="$DIR" "$TESTBED_SRC/node-down.sh"

# Clients first (they only talk to the apiserver), then the apiserver, then etcd.
# shellcheck disable=SC2046
stop_pids "kwok, kube-scheduler, kube-controller-manager" $(pids_of kwok kube-scheduler kube-controller-manager)
# shellcheck disable=SC2046
stop_pids kube-apiserver $(pids_of kube-apiserver)
# shellcheck disable=SC2046
stop_pids etcd $(pids_of etcd)
rm -rf "$PIDS"

# Sweep: processes started from this state directory that the pid files missed (e.g. after a
# crash of up.sh). Matches the directory as a path argument, so another test bed is not touched.
leftovers() {
  local pid args
  for p in /proc/[0-9]*; do
    pid="${p#/proc/}"
    [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
    args="$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" || continue
    case "$args" in
      *"$DIR/"* | *"$DIR "*) ;;
      *) continue ;;
    esac
    case "$(basename "$(readlink "$p/exe" 2>/dev/null)")" in
      etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kwok | kubectl | kubelet | kube-proxy | coredns | containerd | containerd-shim-runc-v2) echo "$pid" ;;
    esac
  done
}
mapfile -t left < <(leftovers)
if ((${#left[@]} > 0)); then
  for pid in "${left[@]}"; do log "leftover: pid $pid: $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-100)"; done
  stop_pids "leftovers" "${left[@]}"
fi

if [[ -f "$DIR/ports.env" ]]; then
  # shellcheck disable=SC1091
  . "$DIR/ports.env"
  for p in ${ETCD_PORT:-} ${ETCD_PEER_PORT:-} ${API_PORT:-} ${KCM_PORT:-} ${SCHED_PORT:-} ${KWOK_PORT:-} \
    ${KUBELET_PORT:-} ${KUBELET_HEALTHZ_PORT:-} ${PROXY_HEALTHZ_PORT:-} ${PROXY_METRICS_PORT:-} ${DNS_HEALTH_PORT:-}; do
    if [[ -n "$(ss -Htln "( sport = :$p )" 2>/dev/null)" ]]; then
      ss -Htlnp "( sport = :$p )" >&2 || true
      die "port $p is still listening"
    fi
  done
fi

# Remove only what up.sh creates (the directory may have been given by the user).
STATE=(.lock ready bin tools-bin helm kubeconfig ports.env pki etcd pv pids storage.yaml nodes.yaml audit.log node node-bin crictl.yaml)
if [[ "${DBOP_TESTBED_KEEP:-0}" == "1" ]]; then
  [[ -f "$DIR/audit.log" ]] && mkdir -p "$DIR/logs" && mv -f "$DIR/audit.log" "$DIR/logs/audit.log"
  for e in "${STATE[@]}"; do rm -rf "${DIR:?}/$e"; done
  log "stopped; logs kept in $DIR/logs"
else
  for e in "${STATE[@]}" logs; do rm -rf "${DIR:?}/$e"; done
  rmdir "$DIR" 2>/dev/null || true
  log "stopped; removed the state in $DIR"
fi
