#!/usr/bin/env bash
# `make run`: the operator on a control plane with the example Database reaching Ready.
#
# With no reachable cluster configured (KUBECONFIG or ~/.kube/config), it starts the local test
# bed (e2e/testbed, a real control plane without Docker) and uses it. Ctrl-C stops everything
# this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
example=${DBOP_EXAMPLE:-docs/examples/database.yaml}
say() { printf '\033[1m[run]\033[0m %s\n' "$*" >&2; }

started_testbed=0
operator_pid=
cleanup() {
  trap - INT TERM EXIT
  if [[ -n "$operator_pid" ]] && kill -0 "$operator_pid" 2>/dev/null; then
    say "stopping dbop"
    kill -TERM "$operator_pid" 2>/dev/null || true
    wait "$operator_pid" 2>/dev/null || true
  fi
  if ((started_testbed)); then
    say "stopping the local control plane"
    e2e/testbed/down.sh || true
  fi
}
trap cleanup INT TERM EXIT

source e2e/testbed/lib.sh
kubectl_bin=kubectl
cluster_reachable() {
  [[ -n "${KUBECONFIG:-}" || -f "$HOME/.kube/config" ]] || return 1
  timeout 10 "$kubectl_bin" version --request-timeout=5s >/dev/null 2>&1
}

if cluster_reachable; then
  say "using the cluster of the current kubeconfig ($("$kubectl_bin" config current-context 2>/dev/null || echo '?'))"
else
  say "no reachable cluster configured: starting the local control plane (e2e/testbed)"
  e2e/testbed/build.sh
  if [[ ! -f "${DBOP_TESTBED_DIR:-$root/.testbed}/ready" ]]; then started_testbed=1; fi
  e2e/testbed/up.sh
  export KUBECONFIG=${DBOP_TESTBED_DIR:-$root/.testbed}/kubeconfig
  kubectl_bin="$(testbed_bin_dir)/kubectl"
fi

say "building dbop"
cargo build --quiet --bin dbop
say "installing the CRDs"
target/debug/dbop crd | "$kubectl_bin" apply --server-side --field-manager=dbop-install -f - >/dev/null
"$kubectl_bin" wait --for condition=Established --timeout=60s crd/databases.dbop.dev crd/databasebackups.dbop.dev >/dev/null

log_file=${DBOP_TESTBED_DIR:-$root/.testbed}/logs/dbop-run.log
mkdir -p "$(dirname "$log_file")"
say "starting dbop (logs: $log_file)"
target/debug/dbop run >"$log_file" 2>&1 &
operator_pid=$!

say "applying $example"
"$kubectl_bin" apply -f "$example"
name=$("$kubectl_bin" get -f "$example" -o jsonpath='{.metadata.name}' 2>/dev/null | awk '{print $NF}')
say "watching Database $name (Ctrl-C stops everything this started)"
last=
deadline=$((SECONDS + 180))
while ((SECONDS < deadline)); do
  if ! kill -0 "$operator_pid" 2>/dev/null; then
    say "dbop exited; last log lines:"; tail -n 20 "$log_file" >&2; exit 1
  fi
  line=$("$kubectl_bin" get database "$name" --no-headers 2>/dev/null || true)
  if [[ -n "$line" && "$line" != "$last" ]]; then
    printf '  %s\n' "$line"; last=$line
  fi
  phase=$("$kubectl_bin" get database "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [[ "$phase" == Ready ]] && break
  sleep 0.5
done
if [[ "$phase" != Ready ]]; then
  say "Database $name did not reach Ready in 3 minutes:"; "$kubectl_bin" describe database "$name" >&2; exit 1
fi
"$kubectl_bin" get database,statefulset,service,job,pvc,secret -l "app.kubernetes.io/instance=$name" 2>/dev/null || true
"$kubectl_bin" get database "$name"
say "Database $name is Ready. Try: KUBECONFIG=$KUBECONFIG $kubectl_bin describe database $name"
if ((started_testbed)); then say "dbop keeps running; Ctrl-C stops it and the local control plane."
else say "dbop keeps running; Ctrl-C stops it."; fi
wait "$operator_pid"
