#!/usr/bin/env bash
# Tears down the real node of the test bed in ${DBOP_TESTBED_DIR:-<repo>/.testbed}, in order:
# delete its pods (through the API server when it is up) -> stop the kubelet -> remove every pod
# sandbox (crictl) -> stop kube-proxy (and remove its iptables rules: kube-proxy --cleanup) and
# CoreDNS -> stop containerd and any shim left -> unmount everything under the node's directory ->
# delete the bridge and the test bed's iptables chain -> remove the cgroups -> restore the sysctls.
# Called by down.sh (which holds the lock) before it stops the control plane; idempotent.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
[[ -d "$DIR" ]] || exit 0
DIR="$(cd "$DIR" && pwd)"
ND="$DIR/node"
PIDS="$DIR/pids"
NODE_NAME=dbop-real-node
NODE_BRIDGE=dbopbr0
NODE_CGROUP=dbop-testbed
NODE_OWNER=/run/dbop-testbed-real-node.owner
[[ -d "$ND" || -f "$PIDS/kubelet.pid" || -f "$PIDS/containerd.pid" ]] || exit 0
log "stopping the real node $NODE_NAME"
NODE_BIN="$(readlink "$DIR/node-bin" 2>/dev/null || testbed_node_bin_dir)"
SOCK="$ND/containerd/containerd.sock"

pid_of() { local f="$PIDS/$1.pid" p; [[ -f "$f" ]] || return 1; p="$(cat "$f")"; kill -0 "$p" 2>/dev/null && echo "$p"; }
stop() { # component...: TERM, up to 15 s, then KILL
  local c p i
  for c in "$@"; do
    p="$(pid_of "$c")" || { rm -f "$PIDS/$c.pid"; continue; }
    kill -TERM "$p" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then log "$c (pid $p) still running after 15s: KILL"; kill -KILL "$p" 2>/dev/null || true; sleep 0.2; fi
    rm -f "$PIDS/$c.pid"
  done
}

# 1. Pods, through the API server (so the kubelet stops them as it would on a drain).
if [[ -f "$DIR/kubeconfig" && -x "$DIR/bin/kubectl" ]] && pid_of kubelet >/dev/null &&
  "$DIR/bin/kubectl" --kubeconfig "$DIR/kubeconfig" --request-timeout 5s get --raw /readyz >/dev/null 2>&1; then
  "$DIR/bin/kubectl" --kubeconfig "$DIR/kubeconfig" delete pods -A --field-selector "spec.nodeName=$NODE_NAME" \
    --grace-period 2 --wait=true --timeout 30s >/dev/null 2>&1 || log "some pods were not deleted in 30s; removing them locally"
fi
# 2. The kubelet. 3. Whatever sandboxes are left, through the CRI.
stop kubelet
if [[ -S "$SOCK" ]] && pid_of containerd >/dev/null; then
  crictl=("$NODE_BIN/crictl" --runtime-endpoint "unix://$SOCK" --timeout 20s)
  "${crictl[@]}" rmp --all --force >/dev/null 2>&1 || log "crictl rmp --all failed (continuing)"
fi
# 4. kube-proxy (then its rules) and CoreDNS.
stop kube-proxy coredns
if [[ -x "$NODE_BIN/kube-proxy" ]]; then
  "$NODE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
# 5. containerd, then any shim or container process it left (they name the node's directory).
stop containerd
leftover_pids() {
  local p args
  for p in /proc/[0-9]*; do
    args="$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" || continue
    [[ "$args" == *"$ND/"* ]] || continue
    case "$(basename "$(readlink "$p/exe" 2>/dev/null)")" in
      containerd-shim-runc-v2 | containerd | kubelet | kube-proxy | coredns | runc) echo "${p#/proc/}" ;;
    esac
  done
}
mapfile -t left < <(leftover_pids)
if ((${#left[@]})); then
  log "killing leftover processes: ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
  sleep 0.5
fi
# 6. Mounts under the node's directory (overlay rootfs, volumes, netns, the kubelet's shared bind
#    mount), deepest first.
unmount_all() {
  local m n=0
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
    n=$((n + 1))
  done < <(awk -v d="$ND" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | uniq)
  return 0
}
for _ in 1 2 3; do unmount_all; done
# 7. Network: pod veths die with their netns; the bridge and our chain go here. The API server
#    listens on the bridge's address (up.sh, API_ADDR): it and its clients stop first, since a
#    stopping API server still talks to itself there (down.sh would stop them next anyway).
if grep -qx "API_ADDR=$(ip -4 -o addr show dev "$NODE_BRIDGE" 2>/dev/null | awk '{print $4}' | cut -d/ -f1)" "$DIR/ports.env" 2>/dev/null; then
  stop kwok kube-scheduler kube-controller-manager kube-apiserver
fi
if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then ip link del "$NODE_BRIDGE" || log "cannot delete $NODE_BRIDGE"; fi
# kube-proxy --cleanup leaves the kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...): remove
# every KUBE-* chain and the rules that jump to them, in IPv4 and IPv6, plus our own chain.
remove_chains() { # iptables|ip6tables
  local ipt="$1" table chain rule
  command -v "$ipt" >/dev/null || return 0
  for table in filter nat mangle; do
    mapfile -t rules < <("$ipt-save" -t "$table" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j (KUBE-|DBOP-TESTBED-)' | grep -vE '^-A (KUBE-|DBOP-)' || true)
    for rule in "${rules[@]}"; do
      # shellcheck disable=SC2086 # (the rule's words are its arguments)
      "$ipt" -w -t "$table" -D ${rule#-A } 2>/dev/null || true
    done
    mapfile -t chains < <("$ipt-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\|DBOP-TESTBED-[^ ]*\) .*/\1/p')
    for chain in "${chains[@]}"; do "$ipt" -w -t "$table" -F "$chain" 2>/dev/null || true; done
    for chain in "${chains[@]}"; do "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || log "cannot delete the $ipt chain $table/$chain"; done
  done
}
remove_chains iptables
remove_chains ip6tables
# 8. cgroups (kubelet's kubepods tree under /dbop-testbed in every hierarchy), deepest first.
for h in /sys/fs/cgroup/*/"$NODE_CGROUP" /sys/fs/cgroup/"$NODE_CGROUP"; do
  [[ -d "$h" ]] || continue
  find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  [[ -d "$h" ]] && log "cannot remove the cgroup $h (processes left in it?)"
done
# 9. sysctls as they were before up.sh.
if [[ -f "$ND/sysctls.saved" ]]; then
  while IFS='=' read -r k v; do
    [[ "$(sysctl -n "$k" 2>/dev/null)" == "$v" ]] || sysctl -qw "$k=$v" || log "cannot restore $k=$v"
  done < "$ND/sysctls.saved"
fi
# 10. Files and directories the node created outside $DIR.
if [[ -f "$ND/created" ]]; then
  while read -r f; do [[ -n "$f" ]] && rm -rf "$f"; done < "$ND/created"
fi
find /var/log/containers -maxdepth 1 -lname "$ND/*" -delete 2>/dev/null || true
rm -rf "$ND" "$DIR/node-bin" "$DIR/crictl.yaml"
if [[ -f "$NODE_OWNER" && "$(cat "$NODE_OWNER")" == "$DIR" ]]; then rm -f "$NODE_OWNER" "$NODE_OWNER.lock"; fi
log "real node stopped"
