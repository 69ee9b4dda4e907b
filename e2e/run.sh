#!/usr/bin/env bash
# `make run`: the operator on a control plane with the example Database reaching Ready.
#
# With no reachable cluster configured (KUBECONFIG or ~/.kube/config), it starts the local test
# bed (e2e/testbed, a real control plane without Docker; in $DBOP_TESTBED_DIR, default
# <repo>/.testbed) and uses it. When the host allows it (root, overlayfs, cgroups) the test bed has
# a real node (kubelet + containerd) and the example runs there with PostgreSQL from the locally
# built image; otherwise it runs on kwok's simulated nodes and says why.
#
# dbop watches only the run's namespace (DBOP_RUN_NAMESPACE, default dbop-run).
# With a reachable cluster configured, it acts on it only when told to: it prints the context and
# asks ([y/N]) when standard input is a terminal, and otherwise refuses unless DBOP_RUN_YES=1
# (`make run YES=1`). Before asking it checks that the images the database pods will pull are
# registry images (DBOP_AGENT_IMAGE, DBOP_POSTGRES_IMAGE_TEMPLATE; not the test bed's local-only
# dbop.local/… names) and stops, having applied nothing, when they are not.
#
# On exit (Ctrl-C included) it removes what it created, and nothing that existed before: the
# example Database (deleted while dbop still runs, so that dbop processes its finalizer), then dbop
# itself, the namespace if it made it, and the CRDs if it installed them on a cluster that had
# none (and no other dbop objects appeared meanwhile). A test bed it started is stopped whole.
#
# Env: DBOP_RUN_YES=1, DBOP_RUN_NAMESPACE (default dbop-run), DBOP_EXAMPLE, DBOP_AGENT_IMAGE,
# DBOP_POSTGRES_IMAGE_TEMPLATE, DBOP_TESTBED_DIR, DBOP_TESTBED_REAL_NODE, DBOP_METRICS_ADDR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export DBOP_TESTBED_DIR=${DBOP_TESTBED_DIR:-$root/.testbed}
example=${DBOP_EXAMPLE:-docs/examples/database.yaml}
namespace=${DBOP_RUN_NAMESPACE:-dbop-run}
# Bold only on a terminal (and never with NO_COLOR): logs and pipes get plain text.
if [[ -t 2 && -z "${NO_COLOR:-}" ]]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
say() { printf '%s[run %s]%s %s\n' "$bold" "$(date +%H:%M:%S)" "$plain" "$*" >&2; }
T0=$SECONDS
step() { # label command...: runs a build step and prints its elapsed time
  local label=$1 t=$SECONDS; shift
  say "$label ..."
  "$@"
  say "$label: done in $((SECONDS - t)) s"
}

source e2e/testbed/lib.sh
# shellcheck source=../release.env
source release.env
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
# The user's kubectl, else the test bed's (built by e2e/testbed/build.sh).
kubectl_bin=kubectl
command -v kubectl >/dev/null || [[ ! -x "$(testbed_bin_dir)/kubectl" ]] || kubectl_bin="$(testbed_bin_dir)/kubectl"
k() { "$kubectl_bin" "$@"; }
kn() { k -n "$namespace" "$@"; }

# What this run made, so that cleanup removes exactly that.
started_testbed=0
operator_pid=
created_namespace=0
created_database=0
installed_crds=()
name=$(awk '/^metadata:/ { m = 1; next } m && /^  name:/ { print $2; exit } /^[^ #]/ { m = 0 }' "$example")
[[ -n "$name" ]] || { say "no metadata.name in $example"; exit 1; }
log_file=$DBOP_TESTBED_DIR/logs/make-run-$namespace.log

start_operator() {
  mkdir -p "$(dirname "$log_file")"
  # Only this run's namespace: Databases elsewhere (another dbop's) are none of its business.
  target/debug/dbop run --watch-namespaces "$namespace" --metrics-addr "${DBOP_METRICS_ADDR:-127.0.0.1:0}" >>"$log_file" 2>&1 &
  operator_pid=$!
}
stop_operator() {
  if [[ -n "$operator_pid" ]] && kill -0 "$operator_pid" 2>/dev/null; then
    say "stopping dbop"
    kill -TERM "$operator_pid" 2>/dev/null || true
    # dbop ends within its 10 s shutdown grace; a dbop that does not is killed after 30 s.
    local deadline=$((SECONDS + 30))
    while kill -0 "$operator_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$operator_pid" 2>/dev/null; then
      say "dbop did not stop within 30 s of SIGTERM: killed (its log: $log_file)"
      kill -KILL "$operator_pid" 2>/dev/null || true
    fi
    wait "$operator_pid" 2>/dev/null || true
  fi
  operator_pid=
}
# Where a Database stands, in one line: its phase, its Ready condition's message, its finalizers.
database_state() {
  kn get database "$name" -o jsonpath='phase {.status.phase}, {.status.conditions[?(@.type=="Ready")].message}, finalizers {.metadata.finalizers}' 2>&1
}
cleanup() {
  local rc=${1:-$?}
  trap - EXIT
  # Another Ctrl-C must not leave dbop running and the Database behind: the clean-up goes on.
  trap 'say "cleaning up: a moment (what is under way is cut short, the rest still runs)"' INT TERM
  if ((started_testbed)); then
    stop_operator
    say "stopping the local control plane (everything this run made goes with it)"
    e2e/testbed/down.sh || true
    exit "$rc"
  fi
  if ((created_database)); then
    # dbop must still run: the Database carries its finalizer (dbop.dev/cleanup).
    if [[ -z "$operator_pid" ]] || ! kill -0 "$operator_pid" 2>/dev/null; then
      say "starting dbop again to process the finalizer of Database $namespace/$name"
      start_operator
    fi
    say "deleting Database $namespace/$name (dbop processes its finalizer)"
    local t=$SECONDS
    if kn delete database "$name" --wait=true --timeout=120s >/dev/null; then
      say "Database $namespace/$name deleted in $((SECONDS - t)) s"
    else
      say "Database $namespace/$name is still there after $((SECONDS - t)) s: $(database_state); dbop's log: $log_file"
    fi
  fi
  stop_operator
  if ((created_namespace)); then
    say "deleting namespace $namespace"
    local t=$SECONDS
    if k delete namespace "$namespace" --wait=true --timeout=120s >/dev/null; then
      say "namespace $namespace deleted in $((SECONDS - t)) s"
    else
      say "namespace $namespace is still terminating after $((SECONDS - t)) s: $(k get namespace "$namespace" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}: {.message}; {end}' 2>&1)"
    fi
  fi
  local crd left
  for crd in "${installed_crds[@]}"; do
    left=$(k get "${crd%%.*}" -A -o name 2>/dev/null | head -n 3 || true)
    if [[ -n "$left" ]]; then
      say "keeping CRD $crd: objects of it exist now ($(echo "$left" | tr '\n' ' '))"
    else
      say "deleting CRD $crd (this run installed it)"
      k delete crd "$crd" --wait=true --timeout=60s >/dev/null || true
    fi
  done
  exit "$rc"
}
# A shell started in the background by a non-interactive one (`nohup make run &`) ignores
# SIGINT, and bash cannot trap a signal ignored at its entry: say which signal still works.
stop_key=Ctrl-C
if [[ "$(trap -p INT)" == "trap -- '' SIGINT" ]]; then
  stop_key="SIGTERM (kill $$)"
  say "SIGINT is ignored in this process (started in the background): stop it with $stop_key, which cleans up the same way"
fi
trap 'cleanup 130' INT
trap 'cleanup 143' TERM
trap cleanup EXIT

cluster_reachable() {
  [[ -n "${KUBECONFIG:-}" || -f "$HOME/.kube/config" ]] || return 1
  command -v "$kubectl_bin" >/dev/null || return 1 # (no kubectl at all: nothing can be reached)
  timeout 10 "$kubectl_bin" version --request-timeout=5s >/dev/null 2>&1
}

# An image its pods can pull: not the test bed's local-only names, and with a registry path
# (a first component that is a host: it has a dot or a port, or is localhost).
registry_image() {
  local ref=$1 host=${1%%/*}
  [[ "$ref" != dbop.local/* && "$ref" == */* ]] || return 1
  [[ "$host" == *.* || "$host" == *:* || "$host" == localhost ]]
}
check_images() { # on a user's cluster: the images the database pods will pull
  local default_template='docker.io/library/postgres:{version}'
  local agent=${DBOP_AGENT_IMAGE:-$DBOP_IMAGE_REPOSITORY:$version}
  local template=${DBOP_POSTGRES_IMAGE_TEMPLATE:-$default_template}
  local spec_image bad=()
  spec_image=$(sed -n 's/^  image: *//p' "$example" | tr -d '"'"'" | head -n 1)
  registry_image "$agent" || bad+=("DBOP_AGENT_IMAGE=$agent")
  registry_image "${template//\{version\}/0}" || bad+=("DBOP_POSTGRES_IMAGE_TEMPLATE=$template")
  [[ -z "$spec_image" ]] || registry_image "$spec_image" || bad+=("spec.image=$spec_image in $example")
  if ((${#bad[@]})); then
    say "this cluster cannot pull: ${bad[*]} (local-only dbop.local/… or no registry path)."
    say "Nothing was applied. Set images it can pull, e.g."
    say "  DBOP_AGENT_IMAGE=registry.example.com/dbop:$version (publish this build: make release PUSH=1 IMAGE_REPOSITORY=registry.example.com/dbop)"
    say "  DBOP_POSTGRES_IMAGE_TEMPLATE='registry.example.com/postgres:{version}' (default docker.io/library/postgres:{version})"
    exit 2
  fi
  if [[ -z "${DBOP_AGENT_IMAGE:-}" ]]; then
    say "database pods will pull $agent (the published release of $version: its instance manager, not this build's; DBOP_AGENT_IMAGE sets another) and $template"
  else
    say "database pods will pull $agent and $template"
  fi
  export DBOP_AGENT_IMAGE=$agent DBOP_POSTGRES_IMAGE_TEMPLATE=$template
}
confirm() { # context
  say "it will: install dbop's CRDs if the cluster has none, create namespace $namespace if absent, run dbop here against it, create Database $namespace/$name from $example (deletionPolicy Delete), and remove all of that on exit"
  if [[ "${DBOP_RUN_YES:-}" == 1 ]]; then
    say "DBOP_RUN_YES=1: going ahead without asking"
  elif [[ -t 0 ]]; then
    local answer
    read -r -p "Apply to context $1? [y/N] " answer
    [[ "$answer" == [yY]* ]] || { say "nothing applied"; exit 1; }
  else
    say "standard input is not a terminal: nothing applied to context $1 without DBOP_RUN_YES=1 (make run YES=1)"
    exit 2
  fi
}

real_node=0
if cluster_reachable; then
  context=$(k config current-context 2>/dev/null || echo '?')
  server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null || echo '?')
  say "a cluster is configured: context $context (server $server)"
  check_images
  confirm "$context"
  mode=existing
else
  mode=testbed
fi

# dbop first: on the real node its image (dbop.local/dbop:dev) is built from these binaries, with a
# static (musl) dbop-instance when the musl target is installed (the debug binaries are linked
# against this host's glibc, which is also the locally built operand images').
step "building dbop (cargo)" cargo build --bins
export DBOP_IMAGE_BIN_DIR=$root/target/debug
if [[ $mode == testbed ]] && rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  step "building a static dbop-instance (musl)" cargo build --target x86_64-unknown-linux-musl -p dbop-instance
  DBOP_IMAGE_BIN_DIR=$root/target/x86_64-unknown-linux-musl/debug:$DBOP_IMAGE_BIN_DIR
fi
if [[ $mode == testbed ]]; then
  say "no reachable cluster configured: starting the local control plane (e2e/testbed in $DBOP_TESTBED_DIR)"
  step "building the test bed (Go; cached after the first run)" e2e/testbed/build.sh
  if [[ ! -f "$DBOP_TESTBED_DIR/ready" ]]; then started_testbed=1; fi
  step "starting the test bed" e2e/testbed/up.sh
  export KUBECONFIG=$DBOP_TESTBED_DIR/kubeconfig
  kubectl_bin="$(testbed_bin_dir)/kubectl"
  if why="$(real_node_unavailable)"; then
    say "no real node ($why): the example runs on kwok's simulated nodes (no container runs)"
  else
    real_node=1
    step "loading dbop's image from these binaries" e2e/testbed/dbop-image.sh
    say "using the real node dbop-real-node: PostgreSQL runs for real (image dbop.local/postgres:15.20)"
    export DBOP_POSTGRES_IMAGE_TEMPLATE='dbop.local/postgres:{version}' DBOP_AGENT_IMAGE=dbop.local/dbop:dev
  fi
fi

# What exists already stays as it is; what this run creates is recorded for cleanup.
if kn get database "$name" >/dev/null 2>&1; then
  say "a Database $namespace/$name exists already: this run changes nothing of it (DBOP_RUN_NAMESPACE picks another namespace)"
  exit 1
fi
missing_crds=()
for crd in databases.dbop.dev databasebackups.dbop.dev; do
  k get crd "$crd" >/dev/null 2>&1 || missing_crds+=("$crd")
done
if ((${#missing_crds[@]} == 0)); then
  say "dbop's CRDs are installed already: left as they are (kubectl apply --server-side --force-conflicts -f crds/dbop.dev.yaml upgrades them)"
else
  say "installing the CRDs"
  installed_crds=("${missing_crds[@]}")
  target/debug/dbop crd | k apply --server-side --field-manager=dbop-install -f - >/dev/null
  # (an older kubectl's wait errs while a new CRD has no status yet: retried)
  for _ in $(seq 60); do
    k wait --for condition=Established --timeout=60s crd/databases.dbop.dev crd/databasebackups.dbop.dev >/dev/null 2>&1 && break
    sleep 1
  done
  k wait --for condition=Established --timeout=5s crd/databases.dbop.dev crd/databasebackups.dbop.dev >/dev/null
fi

if ! k get namespace "$namespace" >/dev/null 2>&1; then
  say "creating namespace $namespace"
  created_namespace=1
  k create namespace "$namespace" >/dev/null
fi

mkdir -p "$(dirname "$log_file")"
: >"$log_file"
say "starting dbop (logs: $log_file)"
start_operator

# The real node's label and taint (e2e/testbed/README.md): the example's pods and Jobs get there
# through spec.placement, the query's pod through its own spec.
real_node_placement='{"nodeSelector": {"testbed.dbop.dev/real-node": "true"},
  "tolerations": [{"key": "testbed.dbop.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}]}'

# The example as a throwaway: in $namespace, deleted with its volume on exit; on the real node at
# the version its images hold, on a real-node volume.
patch='.metadata.namespace = $ns | .spec.deletionPolicy = "Delete"'
if ((real_node)); then
  patch+=' | .spec.version = "15.20" | .spec.storage.storageClassName = "real-node" | .spec.placement = $real_node'
  say "creating $example as $namespace/$name at version 15.20, on a real-node volume"
else
  say "creating $example as $namespace/$name"
fi
k create --dry-run=client -o json -f "$example" | jq --arg ns "$namespace" --argjson real_node "$real_node_placement" "$patch" | k create -f -
created_database=1

# The server's answer through the -rw Service, from a pod on the real node, as the application
# role: every connection setting from the Database's <name>-app Secret, mounted as files (as dbop's
# own pods get theirs) and read into psql's environment inside the container — never on a command
# line or in the pod's spec. The pod runs to completion and its log is printed, so the answer
# shows whether or not this script runs in a terminal.
real_query() {
  local pod=psql-$name-$RANDOM phase='' deadline
  say "querying the server through the Service $name-rw from a pod, as the application role (Secret $name-app):"
  jq -n --arg pod "$pod" --arg s "$name-app" --argjson real_node "$real_node_placement" '{apiVersion: "v1", kind: "Pod",
    metadata: {name: $pod, labels: {"app.kubernetes.io/created-by": "dbop-make-run"}},
    spec: {restartPolicy: "Never", terminationGracePeriodSeconds: 1,
      nodeSelector: $real_node.nodeSelector, tolerations: $real_node.tolerations,
      volumes: [{name: "app", secret: {secretName: $s, defaultMode: 292}}],
      containers: [{name: "psql", image: "dbop.local/postgres:15.20",
        volumeMounts: [{name: "app", mountPath: "/app", readOnly: true}],
        env: [{name: "PGSSLMODE", value: "require"}, {name: "PGCONNECT_TIMEOUT", value: "10"}],
        command: ["sh", "-c", "export PGHOST=\"$(cat /app/host)\" PGPORT=\"$(cat /app/port)\" PGDATABASE=\"$(cat /app/dbname)\" PGUSER=\"$(cat /app/username)\" PGPASSWORD=\"$(cat /app/password)\"; exec psql -Atc \"select current_user, version()\""]}]}}' |
    kn create -f - >/dev/null
  deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    phase=$(kn get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
    sleep 1
  done
  kn logs "$pod" 2>&1 | sed 's/^/  /' || true
  kn delete pod "$pod" --wait=false >/dev/null 2>&1 || true
  if [[ "$phase" != Succeeded ]]; then
    say "the query did not succeed (pod phase ${phase:-unknown})"
    return 1
  fi
}

say "watching Database $namespace/$name ($stop_key stops dbop and removes what this run made)"
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
  say "its pods:"; kn get pods -o wide >&2 || true
  kn logs "$name-0" --all-containers --tail 20 >&2 2>/dev/null || true
  exit 1
fi
kn get database,statefulset,service,job,pvc,secret -l "app.kubernetes.io/instance=$name" 2>/dev/null || true
kn get database "$name"
if ((real_node)); then real_query; fi
say "Database $name is Ready ($((SECONDS - T0)) s). Try: KUBECONFIG=${KUBECONFIG:-~/.kube/config} $kubectl_bin -n $namespace describe database $name"
if ((started_testbed)); then say "dbop keeps running; $stop_key stops it and the local control plane."
else say "dbop keeps running; $stop_key deletes Database $namespace/$name, stops dbop and removes what this run made."; fi
# (wait returns on a signal, so the trap runs at once)
wait "$operator_pid"
