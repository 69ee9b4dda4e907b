#!/usr/bin/env bash
# The test bed's second real node, `dbop-real-node-2`: a second containerd and kubelet on this
# host beside the first real node (node-up.sh), with its own bridge, pod range, cgroups, image
# store and local PersistentVolumes, so that a node's loss is real: its kubelet, its containerd and
# every process of its pods die at once. Brought up on demand by the suites that need two nodes
# (e2e/tests/node_loss.rs, the bench's node-lost kind), torn down by them and by down.sh.
#
#   up       start it (the first real node must be up); idempotent
#   lose     kill -9 its kubelet, its containerd, every shim and every process of its pods: to the
#            API server it looks Ready until the node controller's grace runs out, while nothing
#            on it answers (the way a node that loses power looks)
#   return   start its containerd and kubelet again on the same state (the node came back)
#   down     tear it down: pods, kubelet, sandboxes, containerd, mounts, bridge, rules, cgroups, the
#            Node and its PersistentVolumes; idempotent
#
# Pods land on it only when they tolerate its own taint (`testbed.dbop.dev/second-node`) besides
# the real node's: suites written for one real node never do. Its label `testbed.dbop.dev/real-node`
# is the first node's, so a real-node placement plus that toleration spreads over both.
#
# Network: bridge dbopbr1 10.244.1.1/24 (pods 10.244.1.0/24). The first node's kube-proxy and
# CoreDNS serve both (the nodes share the host's network namespace); the forward rules let the
# two bridges talk to each other and nothing else.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
DIR="$(cd "$DIR" && pwd)"
N2="$DIR/node2"
PKI="$DIR/pki"
NODE2_NAME=dbop-real-node-2
NODE2_BRIDGE=dbopbr1
NODE2_GW=10.244.1.1
NODE2_POD_CIDR=10.244.1.0/24
NODE2_CGROUP=dbop-testbed/node-2 # under the first node's (node-down.sh removes it with it)
NODE2_TAINT=testbed.dbop.dev/second-node
NODE2_PVS="${DBOP_TESTBED_SECOND_NODE_PVS:-12}"
NODE_BIN="$(readlink "$DIR/node-bin" 2>/dev/null || testbed_node_bin_dir)"
KUBECTL=("$DIR/bin/kubectl" --kubeconfig "$DIR/kubeconfig")
SOCK="$N2/containerd/containerd.sock"
# Both bridges may forward to each other; inserted before the first node's rules.
BETWEEN_BRIDGES=(-i dbopbr+ -o dbopbr+ -j RETURN)

pid_of() { local f="$N2/pids/$1.pid" p; [[ -f "$f" ]] || return 1; p="$(cat "$f")"; kill -0 "$p" 2>/dev/null && echo "$p"; }
start() { # component args...
  local c="$1"; shift
  setsid "$@" >>"$N2/logs/$c.log" 2>&1 </dev/null &
  echo $! > "$N2/pids/$c.pid"
}
wait_until() { # seconds description command...
  local deadline=$(( $(date +%s) + $1 )) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || die "second node: $what not within the wait (logs: $N2/logs)"
    sleep 0.2
  done
}
ready() { [[ "$("${KUBECTL[@]}" get node "$NODE2_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; }

network() {
  ip link show "$NODE2_BRIDGE" >/dev/null 2>&1 && die "an interface $NODE2_BRIDGE already exists (a second node left behind? second-node.sh down)"
  if ip -4 route show to match "${NODE2_POD_CIDR%/*}" | grep -v '^default' | grep -q .; then
    die "the range $NODE2_POD_CIDR collides with a route of this host: $(ip -4 route show to match "${NODE2_POD_CIDR%/*}" | grep -v '^default' | head -n 1)"
  fi
  ip link add "$NODE2_BRIDGE" type bridge
  ip addr add "$NODE2_GW/24" dev "$NODE2_BRIDGE"
  ip link set "$NODE2_BRIDGE" up
  iptables -w -I DBOP-TESTBED-NODE 1 "${BETWEEN_BRIDGES[@]}"
  iptables -w -A DBOP-TESTBED-NODE -i "$NODE2_BRIDGE" -j REJECT
  iptables -w -A DBOP-TESTBED-NODE -o "$NODE2_BRIDGE" ! -i "$NODE2_BRIDGE" -j REJECT
  mkdir -p "$N2/cni/net.d" "$N2/cni/ipam"
  testbed_cni_conflist dbop-testbed-2 "$NODE2_BRIDGE" "$N2/cni/ipam" "$NODE2_POD_CIDR" "$NODE2_GW" \
    > "$N2/cni/net.d/10-dbop-testbed-2.conflist"
}

# Its own kubelet cgroup root: with the first node's, each kubelet kills the other's pods.
cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do [[ -f "$h/cgroup.procs" ]] && mkdir -p "$h$NODE2_CGROUP"; done
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] && mkdir -p "/sys/fs/cgroup/$NODE2_CGROUP"
  if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
    cat /sys/fs/cgroup/cpuset/dbop-testbed/cpuset.cpus > "/sys/fs/cgroup/cpuset/$NODE2_CGROUP/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/dbop-testbed/cpuset.mems > "/sys/fs/cgroup/cpuset/$NODE2_CGROUP/cpuset.mems"
  fi
  return 0
}

# The first node's containerd config with this node's paths, sockets, CNI and NRI socket (the
# default NRI socket is shared: a second containerd silently takes it over).
containerd_config() {
  local cd="$N2/containerd"
  mkdir -p "$cd/root" "$cd/state"
  sed -e "s#$DIR/node/#$N2/#g" -e "s#$DIR/node\"#$N2\"#g" "$DIR/node/containerd/config.toml" > "$cd/config.toml"
  cat >> "$cd/config.toml" <<TOML
[plugins.'io.containerd.nri.v1.nri']
  socket_path = "$cd/nri.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "$cd/opt"
TOML
  grep -q "$DIR/node/" "$cd/config.toml" && die "the containerd config still names the first node's directory"
  return 0
}

start_containerd() {
  PATH="$NODE_BIN:$PATH" start containerd "$NODE_BIN/containerd" --config "$N2/containerd/config.toml" --log-level warn
  wait_until 30 "containerd's socket" "$NODE_BIN/ctr" --address "$SOCK" version
}

# The first node's images that its suites run (the list dbop-image.sh keeps current), into this
# node's own store: DBOP_TESTBED_SECOND_NODE_IMAGES, a regular expression on the references.
NODE2_IMAGES="${DBOP_TESTBED_SECOND_NODE_IMAGES:-^dbop[.]local/(pause:testbed|postgres:15[.]20|dbop:dev)$}"
images() {
  local ref tar t0 n=0
  t0=$(date +%s.%N)
  while read -r ref tar; do
    [[ "$ref" =~ $NODE2_IMAGES ]] || continue
    n=$((n + 1))
    "$NODE_BIN/ctr" --address "$SOCK" -n k8s.io images import --local "$tar" >>"$N2/logs/images.log" 2>&1 ||
      die "importing $tar ($ref) into the second node failed: see $N2/logs/images.log"
  done < "$DIR/node/images.list"
  log "second node: $n images imported in $(elapsed "$t0")s"
}

kubelet_config() {
  local kd="$N2/kubelet" port healthz
  mkdir -p "$kd/root" "$kd/pki" "$kd/pod-logs" "$kd/volume-plugins"
  : > "$kd/resolv.conf"
  # A client certificate system:node:dbop-real-node-2 signed by the test bed's CA.
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$N2/kubelet.key" 2>/dev/null
  openssl req -new -key "$N2/kubelet.key" -subj "/O=system:nodes/CN=system:node:$NODE2_NAME" -out "$N2/kubelet.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth" > "$N2/kubelet.ext"
  openssl x509 -req -in "$N2/kubelet.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 30 -sha256 \
    -extfile "$N2/kubelet.ext" -out "$N2/kubelet.crt" 2>/dev/null || die "signing the second node's certificate failed"
  rm -f "$N2/kubelet.csr" "$N2/kubelet.ext"
  # (the first node's kubeconfig names the API server; only the user changes)
  awk -v crt="$(base64 -w0 < "$N2/kubelet.crt")" -v key="$(base64 -w0 < "$N2/kubelet.key")" '
    /client-certificate-data:/ { sub(/:.*/, ": " crt) }
    /client-key-data:/ { sub(/:.*/, ": " key) }
    { print }' "$PKI/kubelet.kubeconfig" > "$N2/kubelet.kubeconfig"
  chmod 600 "$N2/kubelet.kubeconfig"
  # Two free ports for its API and health endpoint (both nodes share the host's ports).
  port=$(free_port); healthz=$(free_port)
  [[ "$port" != "$healthz" ]] || healthz=$(free_port)
  sed -e "s#$DIR/node/#$N2/#g" -e "s#^address: .*#address: $NODE2_GW#" -e "s#^port: .*#port: $port#" \
    -e "s#^healthzPort: .*#healthzPort: $healthz#" -e "s#^cgroupRoot: .*#cgroupRoot: /$NODE2_CGROUP#" \
    -e "s#^- {key: testbed.dbop.dev/real-node, .*#&\n- {key: $NODE2_TAINT, value: \"true\", effect: NoSchedule}#" \
    "$DIR/node/kubelet/config.yaml" > "$kd/config.yaml"
  grep -q "$DIR/node/" "$kd/config.yaml" && die "the kubelet config still names the first node's directory"
  echo "$healthz" > "$N2/healthz.port"
}
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12000))
    [[ -z "$(ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null)" ]] && { echo "$p"; return; }
  done
  die "no free port"
}

start_kubelet() {
  local kd="$N2/kubelet"
  start kubelet "$NODE_BIN/kubelet" --config "$kd/config.yaml" --kubeconfig "$N2/kubelet.kubeconfig" \
    --root-dir "$kd/root" --cert-dir "$kd/pki" --hostname-override "$NODE2_NAME" --node-ip "$NODE2_GW" \
    --node-labels "testbed.dbop.dev/real-node=true,$NODE2_TAINT=true,type=real" --v 1
  wait_until 120 "node $NODE2_NAME Ready" ready
}

# Named anew at each start: the volumes of an earlier start may still be bound to a claim that
# is being deleted (they go once it has).
storage() {
  local i start
  start=$(date +%s)
  for ((i = 0; i < NODE2_PVS; i++)); do
    mkdir -p "$N2/pv/real2-$start-pv-$(printf %04d "$i")"
    printf -- '---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: real2-'"$start"'-pv-%04d\n  labels:\n    %s: "true"\nspec:\n  storageClassName: real-node\n  capacity:\n    storage: 10Gi\n  accessModes: ["ReadWriteOnce"]\n  persistentVolumeReclaimPolicy: Retain\n  volumeMode: Filesystem\n  local:\n    path: %s/pv/real2-'"$start"'-pv-%04d\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: kubernetes.io/hostname, operator: In, values: [%s]}\n' \
      "$i" "$NODE2_TAINT" "$N2" "$i" "$NODE2_NAME"
  done > "$N2/storage.yaml"
  "${KUBECTL[@]}" create -f "$N2/storage.yaml" >>"$N2/logs/kubectl.log" 2>&1 ||
    die "creating the second node's PersistentVolumes failed: $(tail -n 3 "$N2/logs/kubectl.log")"
}

# Pods still bound to the node's name (its kubelet gone, or an earlier start's): removed from
# the API server at once, so that a later start of the node does not run them again.
forget_pods() {
  "${KUBECTL[@]}" --request-timeout 20s delete pods -A --field-selector "spec.nodeName=$NODE2_NAME" \
    --force --grace-period 0 >/dev/null 2>&1 || true
}

up() {
  local t0
  [[ -S "$DIR/node/containerd/containerd.sock" && -f "$DIR/node/images.list" ]] ||
    die "no first real node in $DIR: e2e/testbed/up.sh starts it (as root, see e2e/testbed/README.md)"
  if pid_of kubelet >/dev/null && pid_of containerd >/dev/null && ready; then
    log "second node: $NODE2_NAME already up"
    return 0
  fi
  [[ -d "$N2" ]] && down
  t0=$(date +%s.%N)
  mkdir -p "$N2/logs" "$N2/pids"
  trap 'log "second node: the start failed; tearing it down"; down' EXIT
  forget_pods
  network
  cgroups
  containerd_config
  start_containerd
  images
  kubelet_config
  start_kubelet
  storage
  trap - EXIT
  log "second node: $NODE2_NAME Ready in $(elapsed "$t0")s (pods $NODE2_POD_CIDR on $NODE2_BRIDGE, taint $NODE2_TAINT)"
}

# Every process of the node: its kubelet and containerd, the shims and runc (they name its
# directory), and whatever its pods run (in its cgroups).
node_processes() {
  local p args f
  for p in /proc/[0-9]*; do
    args="$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" || continue
    [[ "$args" == *"$N2/"* ]] && echo "${p#/proc/}"
  done
  for f in $(find /sys/fs/cgroup/pids/"$NODE2_CGROUP" /sys/fs/cgroup/memory/"$NODE2_CGROUP" /sys/fs/cgroup/"$NODE2_CGROUP" -name cgroup.procs 2>/dev/null); do
    cat "$f" 2>/dev/null
  done
  return 0
}
kill_all() {
  local round pids
  for round in 1 2 3 4 5; do
    mapfile -t pids < <(node_processes | sort -u)
    ((${#pids[@]})) || return 0
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
  done
  mapfile -t pids < <(node_processes | sort -u)
  ((${#pids[@]} == 0)) || log "second node: processes left after kill -9: ${pids[*]}"
}

lose() {
  [[ -d "$N2" ]] || die "no second node to lose: second-node.sh up"
  kill_all
  rm -f "$N2/pids/"*.pid
  log "second node: $NODE2_NAME lost (kubelet, containerd and every pod process killed)"
}

return_node() {
  [[ -f "$N2/kubelet/config.yaml" ]] || die "no second node to bring back: second-node.sh up"
  pid_of kubelet >/dev/null && { log "second node: $NODE2_NAME is running"; return 0; }
  # The killed containers' mounts stay behind; the restarted containerd and kubelet find their
  # state on disk as a rebooted node would (its tmpfs state excepted, as here it survives).
  start_containerd
  start_kubelet
  log "second node: $NODE2_NAME back"
}

down() {
  local kd="$N2/kubelet" m r
  [[ -d "$N2" ]] || { "${KUBECTL[@]}" --request-timeout 5s delete node "$NODE2_NAME" --ignore-not-found >/dev/null 2>&1 || true; return 0; }
  log "second node: stopping $NODE2_NAME"
  if pid_of kubelet >/dev/null; then
    "${KUBECTL[@]}" delete pods -A --field-selector "spec.nodeName=$NODE2_NAME" --grace-period 2 --wait=true \
      --timeout 30s >/dev/null 2>&1 || log "second node: some pods were not deleted in 30s; removing them locally"
  fi
  forget_pods
  if pid_of containerd >/dev/null; then
    "$NODE_BIN/crictl" --runtime-endpoint "unix://$SOCK" --timeout 20s rmp --all --force >/dev/null 2>&1 || true
  fi
  kill_all
  for _ in 1 2 3; do
    awk -v d="$N2/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | uniq | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "second node: cannot unmount $m"
    done
  done
  if ip link show "$NODE2_BRIDGE" >/dev/null 2>&1; then ip link del "$NODE2_BRIDGE" || log "cannot delete $NODE2_BRIDGE"; fi
  for r in "${BETWEEN_BRIDGES[*]}" "-i $NODE2_BRIDGE -j REJECT" "! -i $NODE2_BRIDGE -o $NODE2_BRIDGE -j REJECT"; do
    # shellcheck disable=SC2086 # (the rule's words are its arguments)
    while iptables -w -D DBOP-TESTBED-NODE $r 2>/dev/null; do :; done
  done
  for m in /sys/fs/cgroup/*/"$NODE2_CGROUP" /sys/fs/cgroup/"$NODE2_CGROUP"; do
    [[ -d "$m" ]] || continue
    find "$m" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ -d "$m" ]] && log "second node: cannot remove the cgroup $m"
  done
  find /var/log/containers -maxdepth 1 -lname "$N2/*" -delete 2>/dev/null || true
  if "${KUBECTL[@]}" --request-timeout 5s get --raw /readyz >/dev/null 2>&1; then
    "${KUBECTL[@]}" --request-timeout 10s delete node "$NODE2_NAME" --ignore-not-found >/dev/null 2>&1 || true
    "${KUBECTL[@]}" --request-timeout 20s delete pv -l "$NODE2_TAINT=true" --wait=false >/dev/null 2>&1 || true
  fi
  rm -rf "$N2"
  [[ -e "$kd" ]] && log "second node: cannot remove $N2"
  log "second node: $NODE2_NAME down"
}

case "${1:-}" in
  up) up ;;
  lose) lose ;;
  return) return_node ;;
  down) down ;;
  *) die "usage: second-node.sh up|lose|return|down" ;;
esac
