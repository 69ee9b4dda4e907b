#!/usr/bin/env bash
# `make run`: the operator on a control plane with the example Database reaching Ready.
#
# With no reachable cluster configured (KUBECONFIG or ~/.kube/config), it starts the local test
# bed (e2e/testbed, a real control plane without Docker) and uses it. When the host allows it (root,
# overlayfs, cgroups) the test bed has a real node (kubelet + containerd) and the example runs there
# with PostgreSQL from the locally built image; otherwise it runs on kwok's simulated nodes and says
# why. Ctrl-C stops everything this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
example=${DBOP_EXAMPLE:-docs/examples/database.yaml}
say() { printf '\033[1m[run %s]\033[0m %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T0=$SECONDS
step() { # label command...: runs a build step and prints its elapsed time
  local label=$1 t=$SECONDS; shift
  say "$label ..."
  "$@"
  say "$label: done in $((SECONDS - t)) s"
}

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

# dbop first: on the real node its image (dbop.local/dbop:dev) is built from these binaries, with a
# static (musl) dbop-instance when the musl target is installed (the debug binaries are linked
# against this host's glibc, which is also the locally built operand images').
step "building dbop (cargo)" cargo build --bins
export DBOP_IMAGE_BIN_DIR=$root/target/debug
if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  step "building a static dbop-instance (musl)" cargo build --target x86_64-unknown-linux-musl -p dbop-instance
  DBOP_IMAGE_BIN_DIR=$root/target/x86_64-unknown-linux-musl/debug:$DBOP_IMAGE_BIN_DIR
fi
real_node=0
if cluster_reachable; then
  say "using the cluster of the current kubeconfig ($("$kubectl_bin" config current-context 2>/dev/null || echo '?'))"
else
  say "no reachable cluster configured: starting the local control plane (e2e/testbed)"
  step "building the test bed (Go; cached after the first run)" e2e/testbed/build.sh
  if [[ ! -f "${DBOP_TESTBED_DIR:-$root/.testbed}/ready" ]]; then started_testbed=1; fi
  step "starting the test bed" e2e/testbed/up.sh
  export KUBECONFIG=${DBOP_TESTBED_DIR:-$root/.testbed}/kubeconfig
  kubectl_bin="$(testbed_bin_dir)/kubectl"
  if why="$(real_node_unavailable)"; then
    say "no real node ($why): the example runs on kwok's simulated nodes (no container runs)"
  else
    real_node=1
    step "loading dbop's image from these binaries" e2e/testbed/dbop-image.sh
    say "using the real node dbop-real-node: PostgreSQL runs for real (image dbop.local/postgres:15.20)"
  fi
fi
k() { "$kubectl_bin" "$@"; }

say "installing the CRDs"
target/debug/dbop crd | k apply --server-side --field-manager=dbop-install -f - >/dev/null
k wait --for condition=Established --timeout=60s crd/databases.dbop.dev crd/databasebackups.dbop.dev >/dev/null

# On the real node: a namespace that opts in (node selector + toleration added by admission), the
# locally built images, and the example at the version those images hold.
namespace=default
if ((real_node)); then
  namespace=dbop-run
  k apply -f - >/dev/null <<NS
apiVersion: v1
kind: Namespace
metadata:
  name: $namespace
  annotations:
    scheduler.alpha.kubernetes.io/node-selector: testbed.dbop.dev/real-node=true
    scheduler.alpha.kubernetes.io/defaultTolerations: '[{"key":"testbed.dbop.dev/real-node","operator":"Exists","effect":"NoSchedule"}]'
NS
  export DBOP_POSTGRES_IMAGE_TEMPLATE='dbop.local/postgres:{version}' DBOP_AGENT_IMAGE=dbop.local/dbop:dev
fi

log_file=${DBOP_TESTBED_DIR:-$root/.testbed}/logs/dbop-run.log
mkdir -p "$(dirname "$log_file")"
say "starting dbop (logs: $log_file)"
target/debug/dbop run --metrics-addr "${DBOP_METRICS_ADDR:-127.0.0.1:0}" >"$log_file" 2>&1 &
operator_pid=$!

if ((real_node)); then
  say "applying $example in namespace $namespace at version 15.20, on a real-node volume"
  k create --dry-run=client -o json -f "$example" |
    jq --arg ns "$namespace" '.metadata.namespace = $ns | .spec.version = "15.20" | .spec.storage.storageClassName = "real-node"' | k apply -f -
else
  say "applying $example"
  k apply -f "$example"
fi
name=$(k get -f "$example" -o jsonpath='{.metadata.name}' -n "$namespace" 2>/dev/null | awk '{print $NF}')
kn() { k -n "$namespace" "$@"; }

# The server's version through the -rw Service, from a pod on the real node, with the credentials
# from the Database's Secret (as environment from the Secret: never on a command line). The
# username is optional in a user's Secret (default postgres), so the psql pod falls back to it.
real_query() {
  local secret overrides
  secret=$(kn get database "$name" -o jsonpath='{.spec.credentials.secretName}')
  secret=${secret:-$name-credentials}
  overrides=$(jq -cn --arg s "$secret" --arg host "$name-rw" '{
    spec: {terminationGracePeriodSeconds: 1, containers: [{name: "psql", image: "dbop.local/postgres:15.20",
      command: ["sh", "-c", "PGUSER=${DB_USER:-postgres} PGDATABASE=${DB_USER:-postgres} exec psql -h \"$0\" -Atc \"select version()\"", $host],
      env: [{name: "DB_USER", valueFrom: {secretKeyRef: {name: $s, key: "username", optional: true}}},
            {name: "PGPASSWORD", valueFrom: {secretKeyRef: {name: $s, key: "password"}}}]}]}}')
  say "querying the server through the Service $name-rw from a pod:"
  kn run "psql-$RANDOM" --rm -i --restart=Never --quiet --image dbop.local/postgres:15.20 \
    --overrides "$overrides" --pod-running-timeout=2m
}

say "watching Database $namespace/$name (Ctrl-C stops everything this started)"
last=
phase=
deadline=$((SECONDS + 180))
while ((SECONDS < deadline)); do
  if ! kill -0 "$operator_pid" 2>/dev/null; then
    say "dbop exited; last log lines:"; tail -n 20 "$log_file" >&2; exit 1
  fi
  # (phase and conditions only: the AGE column would change the line every second)
  line=$(kn get database "$name" -o jsonpath='{.metadata.name}  {.status.phase}  {range .status.conditions[*]}{.type}={.status} ({.reason}) {end}' 2>/dev/null || true)
  if [[ -n "$line" && "$line" != "$last" ]]; then
    printf '  %s\n' "$line"; last=$line
  fi
  phase=$(kn get database "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [[ "$phase" == Ready ]] && break
  sleep 0.5
done
if [[ "$phase" != Ready ]]; then
  say "Database $name did not reach Ready in 3 minutes:"; kn describe database "$name" >&2
  if ((real_node)); then
    say "its pods on the real node:"; kn get pods -o wide >&2 || true
    kn logs "$name-0" --all-containers --tail 20 >&2 2>/dev/null || true
  fi
  exit 1
fi
kn get database,statefulset,service,job,pvc,secret -l "app.kubernetes.io/instance=$name" 2>/dev/null || true
kn get database "$name"
if ((real_node)); then real_query; fi
say "Database $name is Ready ($((SECONDS - T0)) s). Try: KUBECONFIG=$KUBECONFIG $kubectl_bin -n $namespace describe database $name"
if ((started_testbed)); then say "dbop keeps running; Ctrl-C stops it and the local control plane."
else say "dbop keeps running; Ctrl-C stops it."; fi
wait "$operator_pid"
