#!/usr/bin/env bash
# Brings up the local control plane of the dbop test bed on 127.0.0.1:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, with state in
# ${DBOP_TESTBED_DIR:-<repo>/.testbed}. Writes the admin kubeconfig to $DBOP_TESTBED_DIR/kubeconfig.
# Idempotent: if the test bed is already up and healthy it says so and exits 0.
#
# Env: DBOP_TESTBED_DIR, DBOP_TESTBED_PVS (default 200), DBOP_TESTBED_PV_SIZE (default 100Gi),
#      DBOP_TESTBED_NODES (default 2), DBOP_TESTBED_CACHE / DBOP_TESTBED_BIN_DIR (binaries),
#      DBOP_TESTBED_TIMEOUT (seconds per component health wait, default 120),
#      DBOP_TESTBED_REAL_NODE (auto|0|1: the real node beside the kwok nodes, see node-up.sh),
#      DBOP_TESTBED_REAL_NODE_PVS (default 100), DBOP_TESTBED_NODE_BIN_DIR.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

T0=$(date +%s.%N)
DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
. "$TESTBED_SRC/node-up.sh" # (uses $DIR)
BIN="$(testbed_bin_dir)"
PVS="${DBOP_TESTBED_PVS:-200}"
PV_SIZE="${DBOP_TESTBED_PV_SIZE:-100Gi}"
NODES="${DBOP_TESTBED_NODES:-2}"
TIMEOUT="${DBOP_TESTBED_TIMEOUT:-120}"
KUBECONFIG_OUT="$DIR/kubeconfig"
PKI="$DIR/pki"
LOGS="$DIR/logs"
PIDS="$DIR/pids"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
if REAL_NODE_WHY="$(real_node_unavailable)"; then REAL_NODE=0; else REAL_NODE=1; fi
((REAL_NODE)) && COMPONENTS+=(containerd kubelet kube-proxy coredns)

for b in "${TESTBED_BINARIES[@]}"; do
  [[ -x "$BIN/$b" ]] || die "missing $BIN/$b: run e2e/testbed/build.sh first"
done
for tool in openssl curl ss setsid; do
  command -v "$tool" >/dev/null || die "missing $tool: run e2e/testbed/install-deps.sh (as root)"
done
KUBECTL=("$BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT")

# One up.sh/down.sh at a time per state directory (a second one waits, then finds it up).
exec 8>"$DIR/.lock"
flock 8
export DBOP_TESTBED_LOCKED=1

pid_alive() { local f="$PIDS/$1.pid"; [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

# --- already up? -------------------------------------------------------------------------------
# ($DIR/ready is written last, so a half-finished start does not count as up.)
if [[ -f "$DIR/ready" && -f "$KUBECONFIG_OUT" ]]; then
  all=1
  for c in "${COMPONENTS[@]}"; do pid_alive "$c" || all=0; done
  if ((all)) && "${KUBECTL[@]}" --request-timeout 10s get --raw /readyz >/dev/null 2>&1; then
    log "already up and healthy: $DIR$( ((REAL_NODE)) && echo " (with the real node $NODE_NAME)")"
    echo "kubeconfig: $KUBECONFIG_OUT"
    echo "export KUBECONFIG=$KUBECONFIG_OUT"
    echo "kubectl: $DIR/bin/kubectl"
    exit 0
  fi
fi
if [[ -d "$PIDS" || -f "$DIR/ports.env" ]]; then
  log "found a stopped or partial test bed in $DIR: tearing it down first"
  DBOP_TESTBED_DIR="$DIR" "$TESTBED_SRC/down.sh"
fi
mkdir -p "$PKI" "$LOGS" "$PIDS" "$DIR/pv" "$DIR/etcd"
ln -sfn "$BIN" "$DIR/bin" # $DBOP_TESTBED_DIR/bin/kubectl etc. for tests and humans
ln -sfn "$(testbed_tools_bin_dir)" "$DIR/tools-bin" # $DBOP_TESTBED_DIR/tools-bin/helm (build.sh tools)
chmod 700 "$PKI" "$DIR/etcd"

# --- ports -------------------------------------------------------------------------------------
# Free ports below the kernel's ephemeral range (outgoing connections take their local ports from
# there, and a port in use by one cannot be listened on), not used by any socket in any state.
declare -A USED=()
read -r EPHEMERAL_LOW _ < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || EPHEMERAL_LOW=32768
PORT_LO=20000 PORT_HI=$((EPHEMERAL_LOW - 1))
((PORT_HI - PORT_LO >= 1000)) || { PORT_LO=10000; PORT_HI=$((EPHEMERAL_LOW - 1)); }
((PORT_HI - PORT_LO >= 1000)) || { PORT_LO=61000; PORT_HI=65000; }
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((PORT_LO + RANDOM % (PORT_HI - PORT_LO + 1)))
    [[ -n "${USED[$p]:-}" ]] && continue
    if [[ -z "$(ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null)" ]]; then USED[$p]=1; echo "$p"; return; fi
  done
  die "no free port found in $PORT_LO-$PORT_HI"
}
ETCD_PORT=$(free_port); ETCD_PEER_PORT=$(free_port); API_PORT=$(free_port)
KCM_PORT=$(free_port); SCHED_PORT=$(free_port); KWOK_PORT=$(free_port)
KUBELET_PORT=$(free_port); KUBELET_HEALTHZ_PORT=$(free_port); PROXY_HEALTHZ_PORT=$(free_port)
PROXY_METRICS_PORT=$(free_port); DNS_HEALTH_PORT=$(free_port)
cat > "$DIR/ports.env" <<PORTS
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
API_PORT=$API_PORT
KCM_PORT=$KCM_PORT
SCHED_PORT=$SCHED_PORT
KWOK_PORT=$KWOK_PORT
PORTS
((REAL_NODE)) && cat >> "$DIR/ports.env" <<PORTS
KUBELET_PORT=$KUBELET_PORT
KUBELET_HEALTHZ_PORT=$KUBELET_HEALTHZ_PORT
PROXY_HEALTHZ_PORT=$PROXY_HEALTHZ_PORT
PROXY_METRICS_PORT=$PROXY_METRICS_PORT
DNS_HEALTH_PORT=$DNS_HEALTH_PORT
PORTS

# --- the API server's address ----------------------------------------------------------------------
# kwok only: 127.0.0.1. With the real node: the bridge's address 10.244.0.1 (internal to this host,
# never the external interface), so that pods reach it through the `kubernetes` Service
# (10.96.0.1:443, routed by kube-proxy to the endpoint the API server keeps for itself).
api_address() {
  if ((REAL_NODE)); then
    node_prepare
    API_ADDR="$NODE_GW"
  else
    API_ADDR=127.0.0.1
  fi
  echo "API_ADDR=$API_ADDR" >> "$DIR/ports.env"
  SERVER="https://$API_ADDR:$API_PORT"
}
# The API server's flags that depend on it: with the real node it advertises the bridge address
# and keeps the `kubernetes` Service's endpoints (a lease), else there are none to keep.
api_address_flags() {
  if [[ "$API_ADDR" == 127.0.0.1 ]]; then
    echo "--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none"
  else
    echo "--bind-address $API_ADDR --advertise-address $API_ADDR --endpoint-reconciler-type lease"
  fi
}
api_address

# --- certificates ------------------------------------------------------------------------------
ossl() { openssl "$@" 2>>"$LOGS/openssl.log" >/dev/null || die "openssl $1 failed (see $LOGS/openssl.log)"; }
newkey() { ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
newkey "$PKI/ca.key"
ossl req -x509 -new -key "$PKI/ca.key" -sha256 -days 3650 -subj "/CN=dbop-testbed-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$PKI/ca.crt"
sign() { # name subject extensions
  newkey "$PKI/$1.key"
  ossl req -new -key "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "$3" > "$PKI/$1.ext"
  ossl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/$1.ext" -out "$PKI/$1.crt"
  rm -f "$PKI/$1.csr" "$PKI/$1.ext"
}
sign apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,$([[ $API_ADDR == 127.0.0.1 ]] || echo "IP:$API_ADDR,")IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin "/O=system:masters/CN=dbop-testbed-admin" "extendedKeyUsage=clientAuth"
sign kube-controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
sign kube-scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
sign kwok "/O=system:masters/CN=kwok" "extendedKeyUsage=clientAuth"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
# Front proxy (aggregation layer) CA and client: without a request-header CA the controller-manager
# and scheduler keep logging "missing content for CA bundle".
newkey "$PKI/front-proxy-ca.key"
ossl req -x509 -new -key "$PKI/front-proxy-ca.key" -sha256 -days 3650 -subj "/CN=dbop-testbed-front-proxy-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$PKI/front-proxy-ca.crt"
newkey "$PKI/front-proxy-client.key"
ossl req -new -key "$PKI/front-proxy-client.key" -subj "/CN=front-proxy-client" -out "$PKI/front-proxy-client.csr"
printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth" > "$PKI/front-proxy-client.ext"
ossl x509 -req -in "$PKI/front-proxy-client.csr" -CA "$PKI/front-proxy-ca.crt" -CAkey "$PKI/front-proxy-ca.key" -CAcreateserial \
  -days 3650 -sha256 -extfile "$PKI/front-proxy-client.ext" -out "$PKI/front-proxy-client.crt"
rm -f "$PKI/front-proxy-client.csr" "$PKI/front-proxy-client.ext"
newkey "$PKI/sa.key"
ossl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"

kubeconfig() { # out user
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: dbop-testbed
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 < "$PKI/$2.crt")
    client-key-data: $(base64 -w0 < "$PKI/$2.key")
contexts:
- name: dbop-testbed
  context:
    cluster: dbop-testbed
    user: $2
current-context: dbop-testbed
KC
  chmod 600 "$1"
}
for u in kube-controller-manager kube-scheduler kwok; do kubeconfig "$PKI/$u.kubeconfig" "$u"; done

# --- process helpers ---------------------------------------------------------------------------
start() { # component args...
  local c="$1"; shift
  log "starting $c"
  setsid "$@" >"$LOGS/$c.log" 2>&1 </dev/null 8>&- &
  echo $! > "$PIDS/$c.pid"
}
fail() { # component message
  log "ERROR: $1 $2"
  if [[ -f "$LOGS/$1.log" ]]; then
    echo "----- last 40 lines of $LOGS/$1.log -----" >&2
    tail -n 40 "$LOGS/$1.log" >&2
    echo "-----" >&2
  fi
  # A port taken between choosing and binding it: start once more on other ports.
  if [[ "${DBOP_TESTBED_ATTEMPT:-1}" == 1 ]] && tail -n 40 "$LOGS/$1.log" 2>/dev/null | grep -qi 'address already in use'; then
    log "$1 could not bind its port: tearing down and starting again on other ports"
    DBOP_TESTBED_DIR="$DIR" "$TESTBED_SRC/down.sh" >/dev/null 2>&1 || true
    DBOP_TESTBED_ATTEMPT=2 DBOP_TESTBED_DIR="$DIR" exec "$TESTBED_SRC/up.sh"
  fi
  log "the test bed is left as it is for inspection; run e2e/testbed/down.sh to clean up"
  exit 1
}
wait_for() { # component description command...
  local c="$1" what="$2"; shift 2
  local deadline=$(( $(date +%s) + TIMEOUT ))
  until "$@" >/dev/null 2>&1; do
    pid_alive "$c" || fail "$c" "exited while waiting for $what"
    (( $(date +%s) < deadline )) || fail "$c" "not healthy after ${TIMEOUT}s ($what)"
    sleep 0.25
  done
  log "$c: $what ok ($(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}")s)"
}

# --- etcd --------------------------------------------------------------------------------------
start etcd "$BIN/etcd" --name testbed --data-dir "$DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "testbed=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync --log-level warn --quota-backend-bytes 4294967296
wait_for etcd /health curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver ----------------------------------------------------------------------------
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  $(api_address_flags) --secure-port "$API_PORT" \
  --cert-dir "$PKI" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range 10.96.0.0/16 \
  --authorization-mode Node,RBAC --allow-privileged=true \
  --kubelet-preferred-address-types InternalIP \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --audit-log-path "$DIR/audit.log" --audit-policy-file "$TESTBED_SRC/audit-policy.yaml" \
  --audit-log-format json --audit-log-mode blocking --audit-log-maxsize 0 \
  --profiling=false
wait_for kube-apiserver /readyz curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$SERVER/readyz"
kubeconfig "$KUBECONFIG_OUT" admin

# --- kube-controller-manager and kube-scheduler --------------------------------------------------
KCM_CFG="$PKI/kube-controller-manager.kubeconfig"
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$KCM_CFG" --authentication-kubeconfig "$KCM_CFG" --authorization-kubeconfig "$KCM_CFG" \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --cert-dir "$PKI/kcm" \
  --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
  --node-monitor-grace-period 120s \
  --kube-api-qps 200 --kube-api-burst 400 --profiling=false
SCHED_CFG="$PKI/kube-scheduler.kubeconfig"
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig "$SCHED_CFG" --authentication-kubeconfig "$SCHED_CFG" --authorization-kubeconfig "$SCHED_CFG" \
  --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --cert-dir "$PKI/scheduler" \
  --leader-elect=false --kube-api-qps 200 --kube-api-burst 400 --profiling=false
start kwok "$BIN/kwok" \
  --kubeconfig "$PKI/kwok.kubeconfig" --config "$TESTBED_SRC/kwok-stages.yaml" \
  --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --server-address "127.0.0.1:$KWOK_PORT" --cidr 10.0.0.0/16 \
  --node-ip 127.0.0.1 --node-port "$KWOK_PORT"
wait_for kube-controller-manager /healthz curl -kfsS "https://127.0.0.1:$KCM_PORT/healthz"
wait_for kube-scheduler /healthz curl -kfsS "https://127.0.0.1:$SCHED_PORT/healthz"
wait_for kwok /healthz curl -fsS "http://127.0.0.1:$KWOK_PORT/healthz"

# --- storage: default StorageClass and a pool of PersistentVolumes -------------------------------
{
  cat <<SC
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
reclaimPolicy: Retain
allowVolumeExpansion: true
SC
  for ((i = 0; i < PVS; i++)); do
    printf -- '---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: testbed-pv-%04d\n  labels:\n    testbed.dbop.dev/pool: "true"\nspec:\n  storageClassName: standard\n  capacity:\n    storage: %s\n  accessModes: ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"]\n  persistentVolumeReclaimPolicy: Retain\n  volumeMode: Filesystem\n  hostPath:\n    path: %s/pv/testbed-pv-%04d\n    type: DirectoryOrCreate\n' \
      "$i" "$PV_SIZE" "$DIR" "$i"
  done
} > "$DIR/storage.yaml"
"${KUBECTL[@]}" create -f "$DIR/storage.yaml" >"$LOGS/kubectl.log" 2>&1 ||
  { tail -n 5 "$LOGS/kubectl.log" >&2; fail kube-apiserver "creating the StorageClass and $PVS PersistentVolumes failed"; }
log "storage: StorageClass standard (default) and $PVS PersistentVolumes of $PV_SIZE"

# --- fake nodes --------------------------------------------------------------------------------
for ((i = 0; i < NODES; i++)); do
  cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  labels:
    type: kwok
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    topology.kubernetes.io/zone: testbed-zone-$((i % 3))
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
NODE
done > "$DIR/nodes.yaml"
"${KUBECTL[@]}" create -f "$DIR/nodes.yaml" >>"$LOGS/kubectl.log" 2>&1 ||
  { tail -n 5 "$LOGS/kubectl.log" >&2; fail kube-apiserver "creating the nodes failed"; }
nodes_ready() {
  local n
  n=$("${KUBECTL[@]}" get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$')
  ((n == NODES))
}
wait_for kwok "$NODES nodes Ready" nodes_ready
# The controllers are working once the default ServiceAccount exists.
wait_for kube-controller-manager "default ServiceAccount" "${KUBECTL[@]}" -n default get serviceaccount default

# --- the real node --------------------------------------------------------------------------------
if ((REAL_NODE)); then
  node_up
else
  log "real node: none ($REAL_NODE_WHY); kwok nodes only"
fi

date -u +%Y-%m-%dT%H:%M:%SZ > "$DIR/ready"
ELAPSED=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}")
log "up in ${ELAPSED}s: kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION; state in $DIR"
echo "kubeconfig: $KUBECONFIG_OUT"
echo "export KUBECONFIG=$KUBECONFIG_OUT"
echo "kubectl: $DIR/bin/kubectl"
if ((REAL_NODE)); then echo "real node: $NODE_NAME (pods select it and tolerate its taint: e2e/testbed/README.md)"; else echo "real node: none ($REAL_NODE_WHY)"; fi
echo "startup took ${ELAPSED}s"
