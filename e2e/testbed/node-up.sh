# The real node of the test bed: containerd + kubelet + kube-proxy + CoreDNS on this host, beside
# the kwok nodes. Sourced by up.sh: node_prepare (the bridge) before the control plane starts,
# node_up after (uses its start/wait_for/sign/kubeconfig helpers and variables); torn down by
# node-down.sh.
#
# Network: bridge dbopbr0 10.244.0.1/24 (pods 10.244.0.0/24, host-local IPAM), Services 10.96.0.0/16
# through kube-proxy (iptables), DNS through CoreDNS listening on 10.244.0.1:53. Nothing is routed off
# the host: forwarding from the bridge to any other interface is rejected and nothing is masqueraded.
# shellcheck shell=bash

NODE_NAME=dbop-real-node
NODE_DIR="$DIR/node"
NODE_BIN="$(testbed_node_bin_dir)"
NODE_BRIDGE=dbopbr0
NODE_POD_CIDR=10.244.0.0/24
NODE_GW=10.244.0.1
NODE_SVC_CIDR=10.96.0.0/16
NODE_PVS="${DBOP_TESTBED_REAL_NODE_PVS:-100}"
NODE_OWNER=/run/dbop-testbed-real-node.owner
NODE_CGROUP=dbop-testbed
# sysctls the kubelet, kube-proxy and the bridge change; saved before and restored by node-down.sh
NODE_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.route_localnet
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait)

# The real node is one per machine (one bridge, one address range, one set of host iptables chains).
node_claim() {
  local owner
  exec 5>"$NODE_OWNER.lock"
  flock 5
  if [[ -f "$NODE_OWNER" ]]; then
    owner="$(cat "$NODE_OWNER")"
    if [[ "$owner" != "$DIR" && -f "$owner/pids/kubelet.pid" ]] && kill -0 "$(cat "$owner/pids/kubelet.pid")" 2>/dev/null; then
      exec 5>&-
      fail_node "the real node is in use by the test bed in $owner (one per machine): stop it with DBOP_TESTBED_DIR=$owner e2e/testbed/down.sh, or start this one without it: DBOP_TESTBED_REAL_NODE=0"
    fi
    if [[ "$owner" != "$DIR" ]]; then
      log "real node: the test bed in $owner left its real node behind; cleaning it up"
      DBOP_TESTBED_DIR="$owner" DBOP_TESTBED_NODE_ONLY=1 "$TESTBED_SRC/node-down.sh" || true
    fi
  fi
  echo "$DIR" > "$NODE_OWNER"
  exec 5>&-
}
fail_node() { log "ERROR: $*"; log "the test bed is left as it is for inspection; run e2e/testbed/down.sh to clean up"; exit 1; }

node_check_network() {
  local r
  for r in "$NODE_POD_CIDR" "$NODE_SVC_CIDR"; do
    if ip -4 route show to match "${r%/*}" | grep -v '^default' | grep -vw "$NODE_BRIDGE" | grep -q .; then
      fail_node "the range $r collides with a route of this host: $(ip -4 route show to match "${r%/*}" | grep -v '^default' | head -n 1)"
    fi
  done
  if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    fail_node "an interface $NODE_BRIDGE already exists (a real node left behind? e2e/testbed/node-down.sh with its DBOP_TESTBED_DIR)"
  fi
}

node_save_host_state() {
  local s v
  mkdir -p "$NODE_DIR"
  : > "$NODE_DIR/sysctls.saved"
  modprobe br_netfilter 2>/dev/null || true
  for s in "${NODE_SYSCTLS[@]}"; do
    v="$(sysctl -n "$s" 2>/dev/null)" && printf '%s=%s\n' "$s" "$v" >> "$NODE_DIR/sysctls.saved"
  done
  : > "$NODE_DIR/created"
  [[ -e /run/containerd ]] || echo /run/containerd >> "$NODE_DIR/created"
  [[ -e /var/log/containers ]] || echo /var/log/containers >> "$NODE_DIR/created"
}

node_network() {
  ip link add "$NODE_BRIDGE" type bridge
  ip addr add "$NODE_GW/24" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  # Never route pod traffic off the host: the bridge may forward only to itself.
  iptables -w -N DBOP-TESTBED-NODE
  iptables -w -A DBOP-TESTBED-NODE -i "$NODE_BRIDGE" -o "$NODE_BRIDGE" -j RETURN
  iptables -w -A DBOP-TESTBED-NODE -i "$NODE_BRIDGE" -j REJECT
  iptables -w -A DBOP-TESTBED-NODE -o "$NODE_BRIDGE" ! -i "$NODE_BRIDGE" -j REJECT
  iptables -w -I FORWARD 1 -j DBOP-TESTBED-NODE
  mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam"
  testbed_cni_conflist dbop-testbed "$NODE_BRIDGE" "$NODE_DIR/cni/ipam" "$NODE_POD_CIDR" "$NODE_GW" \
    > "$NODE_DIR/cni/net.d/10-dbop-testbed.conflist"
}

node_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -f "$h/cgroup.procs" ]] || continue
    mkdir -p "$h$NODE_CGROUP"
  done
  [[ -f /sys/fs/cgroup/cgroup.controllers ]] && mkdir -p "/sys/fs/cgroup/$NODE_CGROUP"
  # cgroup v1 cpuset: a new cgroup starts with no CPUs and memory nodes; give it the root's.
  if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset/$NODE_CGROUP/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset/$NODE_CGROUP/cpuset.mems"
  fi
  return 0
}

node_containerd() {
  local cd="$NODE_DIR/containerd"
  mkdir -p "$cd/root" "$cd/state"
  cat > "$cd/config.toml" <<TOML
version = 3
root = "$cd/root"
state = "$cd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$cd/containerd.sock"
[ttrpc]
  address = "$cd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "dbop.local/pause:testbed"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$TESTBED_CNI_BIN_DIR"]
    conf_dir = "$NODE_DIR/cni/net.d"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$(command -v runc)"
      Root = "$cd/runc"
      SystemdCgroup = false
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML
  # The shim is found on PATH.
  PATH="$NODE_BIN:$PATH" start containerd "$NODE_BIN/containerd" --config "$cd/config.toml" --log-level warn
  wait_for containerd "socket" "$NODE_BIN/ctr" --address "$cd/containerd.sock" version
  ln -sfn "$NODE_BIN" "$DIR/node-bin" # $DBOP_TESTBED_DIR/node-bin/crictl etc.
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' \
    "$cd/containerd.sock" "$cd/containerd.sock" > "$DIR/crictl.yaml"
}

node_images() {
  local t0 ref tar n=0
  t0=$(date +%s.%N)
  "$TESTBED_SRC/images.sh" > "$NODE_DIR/images.list" 2>"$LOGS/images.log" ||
    { tail -n 20 "$LOGS/images.log" >&2; fail_node "building the images failed (log: $LOGS/images.log)"; }
  while read -r ref tar; do
    "$NODE_BIN/ctr" --address "$NODE_DIR/containerd/containerd.sock" -n k8s.io images import \
      --local "$tar" >>"$LOGS/images.log" 2>&1 || fail_node "importing $tar ($ref) failed: see $LOGS/images.log"
    n=$((n + 1))
  done < "$NODE_DIR/images.list"
  log "real node: $n images built/imported in $(elapsed "$t0")s: $(awk '{printf "%s ", $1}' "$NODE_DIR/images.list")"
}

node_pki() {
  sign kubelet-"$NODE_NAME" "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
  sign kube-proxy "/CN=system:kube-proxy" "extendedKeyUsage=clientAuth"
  sign coredns "/O=system:masters/CN=coredns" "extendedKeyUsage=clientAuth"
  kubeconfig "$PKI/kubelet.kubeconfig" "kubelet-$NODE_NAME"
  kubeconfig "$PKI/kube-proxy.kubeconfig" kube-proxy
  kubeconfig "$PKI/coredns.kubeconfig" coredns
}

node_kubelet() {
  local kd="$NODE_DIR/kubelet"
  mkdir -p "$kd/root" "$kd/pki" "$kd/pod-logs" "$kd/volume-plugins"
  : > "$kd/resolv.conf" # pods get only the cluster DNS, never the host's resolvers
  cat > "$kd/config.yaml" <<KUBELET
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_GW
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$NODE_DIR/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$NODE_CGROUP
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
clusterDNS: [$NODE_GW]
clusterDomain: cluster.local
resolvConf: $kd/resolv.conf
podLogsDir: $kd/pod-logs
volumePluginDir: $kd/volume-plugins
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
serializeImagePulls: false
maxPods: 60
registerWithTaints:
- {key: testbed.dbop.dev/real-node, value: "true", effect: NoSchedule}
nodeStatusReportFrequency: 10s
KUBELET
  start kubelet "$NODE_BIN/kubelet" --config "$kd/config.yaml" --kubeconfig "$PKI/kubelet.kubeconfig" \
    --root-dir "$kd/root" --cert-dir "$kd/pki" --hostname-override "$NODE_NAME" --node-ip "$NODE_GW" \
    --node-labels "testbed.dbop.dev/real-node=true,type=real" --v 1
}

node_proxy_dns() {
  cat > "$NODE_DIR/kube-proxy.yaml" <<PROXY
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $PKI/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $NODE_POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
nodePortAddresses: ["$NODE_GW/32"]
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
PROXY
  start kube-proxy "$NODE_BIN/kube-proxy" --config "$NODE_DIR/kube-proxy.yaml" --v 1
  cat > "$NODE_DIR/Corefile" <<DNS
.:53 {
  bind $NODE_GW
  errors
  health 127.0.0.1:$DNS_HEALTH_PORT
  kubernetes cluster.local in-addr.arpa ip6.arpa {
    kubeconfig $PKI/coredns.kubeconfig dbop-testbed
    pods insecure
    fallthrough in-addr.arpa ip6.arpa
  }
  cache 5
}
DNS
  start coredns "$NODE_BIN/coredns" -conf "$NODE_DIR/Corefile"
}

node_storage() {
  local i
  {
    cat <<SC
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: real-node
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
allowVolumeExpansion: true
SC
    for ((i = 0; i < NODE_PVS; i++)); do
      mkdir -p "$NODE_DIR/pv/real-pv-$(printf %04d "$i")"
      printf -- '---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: real-pv-%04d\n  labels:\n    testbed.dbop.dev/real-node: "true"\nspec:\n  storageClassName: real-node\n  capacity:\n    storage: 10Gi\n  accessModes: ["ReadWriteOnce"]\n  persistentVolumeReclaimPolicy: Retain\n  volumeMode: Filesystem\n  local:\n    path: %s/pv/real-pv-%04d\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: kubernetes.io/hostname, operator: In, values: [%s]}\n' \
        "$i" "$NODE_DIR" "$i" "$NODE_NAME"
    done
  } > "$NODE_DIR/storage.yaml"
  "${KUBECTL[@]}" create -f "$NODE_DIR/storage.yaml" >>"$LOGS/kubectl.log" 2>&1 ||
    { tail -n 5 "$LOGS/kubectl.log" >&2; fail_node "creating the real node's StorageClass and PVs failed"; }
}

node_ready() {
  [[ "$("${KUBECTL[@]}" get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

# The node's network before the control plane starts: the API server listens on the bridge's
# address ($NODE_GW), so that pods reach it through the `kubernetes` Service. Called by up.sh.
node_prepare() {
  [[ -x "$NODE_BIN/kubelet" ]] || fail_node "missing $NODE_BIN/kubelet: run e2e/testbed/build.sh node"
  node_claim
  node_check_network
  node_save_host_state
  node_network
}

# Brings the real node up; called by up.sh with the control plane running (after node_prepare).
node_up() {
  local t0
  t0=$(date +%s.%N)
  node_cgroups
  node_containerd
  node_images
  node_pki
  node_kubelet
  node_proxy_dns
  wait_for kubelet "node $NODE_NAME Ready" node_ready
  wait_for kube-proxy /healthz curl -fsS "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz"
  wait_for coredns /health curl -fsS "http://127.0.0.1:$DNS_HEALTH_PORT/health"
  node_storage
  log "real node $NODE_NAME Ready in $(elapsed "$t0")s (pods $NODE_POD_CIDR on $NODE_BRIDGE, DNS $NODE_GW)"
}
