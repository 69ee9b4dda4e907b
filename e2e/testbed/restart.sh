#!/usr/bin/env bash
# Restarts one control-plane component of a running test bed with its original flags, as a
# crash would: e2e/testbed/restart.sh COMPONENT [DOWN_SECONDS]
#
#   COMPONENT      etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kwok
#   DOWN_SECONDS   how long it stays down before it is started again (default 0)
#
# The command line is read from the running process (/proc/PID/cmdline), so the component comes
# back exactly as up.sh started it (same ports, data, certificates, log file — appended to).
# DBOP_TESTBED_RESTART_SIGNAL (default KILL) is the signal that stops it; TERM is a clean stop.
# Returns once the API server answers /readyz again (through the admin kubeconfig).
#
#   restart.sh stop COMPONENT    stop it and keep its command line for `start`
#   restart.sh start COMPONENT   start it again from the kept command line and wait for /readyz
set -euo pipefail
TESTBED_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$TESTBED_SRC/lib.sh"
DIR="${DBOP_TESTBED_DIR:-$(cd "$TESTBED_SRC/../.." && pwd)/.testbed}"
PIDS="$DIR/pids"
LOGS="$DIR/logs"
SIGNAL="${DBOP_TESTBED_RESTART_SIGNAL:-KILL}"
TIMEOUT="${DBOP_TESTBED_TIMEOUT:-120}"
COMPONENTS=" etcd kube-apiserver kube-controller-manager kube-scheduler kwok "

usage() { die "usage: $0 COMPONENT [DOWN_SECONDS] | stop COMPONENT | start COMPONENT (components:$COMPONENTS)"; }
check_component() { [[ "$COMPONENTS" == *" $1 "* ]] || usage; }

stop_component() { # component
  local c="$1" pid
  pid="$(cat "$PIDS/$c.pid" 2>/dev/null)" || die "$c: no pid file in $PIDS (is the test bed up?)"
  kill -0 "$pid" 2>/dev/null || die "$c (pid $pid) is not running"
  cp "/proc/$pid/cmdline" "$PIDS/$c.cmdline"
  kill "-$SIGNAL" "$pid"
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; }
  log "$c stopped (SIG$SIGNAL, pid $pid)"
}

start_component() { # component
  local c="$1" args=()
  [[ -f "$PIDS/$c.cmdline" ]] || die "$c: no kept command line (stop it with this script first)"
  mapfile -d '' args < "$PIDS/$c.cmdline"
  setsid "${args[@]}" >>"$LOGS/$c.log" 2>&1 </dev/null &
  echo $! > "$PIDS/$c.pid"
  rm -f "$PIDS/$c.cmdline"
  local deadline=$(( $(date +%s) + TIMEOUT ))
  until "$DIR/bin/kubectl" --kubeconfig "$DIR/kubeconfig" get --raw /readyz >/dev/null 2>&1; do
    kill -0 "$(cat "$PIDS/$c.pid")" 2>/dev/null || die "$c exited after the restart (see $LOGS/$c.log)"
    (( $(date +%s) < deadline )) || die "the API server is not ready ${TIMEOUT}s after restarting $c"
    sleep 0.2
  done
  log "$c started again (pid $(cat "$PIDS/$c.pid")); the API server is ready"
}

case "${1:-}" in
  stop) check_component "${2:-}"; stop_component "$2" ;;
  start) check_component "${2:-}"; start_component "$2" ;;
  *)
    check_component "${1:-}"
    stop_component "$1"
    sleep "${2:-0}"
    start_component "$1"
    ;;
esac
