# Shared helpers for the test bed scripts (sourced, not run).
# shellcheck shell=bash
# shellcheck disable=SC2034 # (variables used by the scripts that source this file)

TESTBED_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$TESTBED_SRC/../.." && pwd)"

# shellcheck source=versions.env
. "$TESTBED_SRC/versions.env"

# The Go environment of every script: the pinned toolchain (if any), module mode without a
# workspace, the module proxy, and no cgo.
if [[ -n "${GOTOOLCHAIN_VERSION:-}" ]]; then
  export GOTOOLCHAIN="$GOTOOLCHAIN_VERSION"
else
  export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
fi
export GOWORK=off
export GOFLAGS="-mod=readonly"
export CGO_ENABLED=0

log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Build flags as upstream builds its release binaries (hack/lib/golang.sh, etcd's build.sh,
# containerd's Makefile), plus -trimpath and -s -w (no symbol table / DWARF: smaller, faster links).
TESTBED_GO_TAGS="selinux,notest,grpcnotrace"
k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
TESTBED_K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  TESTBED_K8S_LDFLAGS+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  TESTBED_K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
TESTBED_ETCD_LDFLAGS="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"
TESTBED_KWOK_LDFLAGS="-s -w"
TESTBED_CONTAINERD_TAGS="no_btrfs,no_devmapper,no_zfs"
TESTBED_CONTAINERD_LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION -X github.com/containerd/containerd/v2/version.Revision=module"
TESTBED_COREDNS_LDFLAGS="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
TESTBED_CRICTL_LDFLAGS="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION"
# As helm's Makefile for a tagged release (no git metadata: module zips carry none).
TESTBED_HELM_LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
# Two groups of binaries, each cached in its own directory keyed by its own inputs, so adding or
# changing a node component never moves the control plane's binaries (and the reverse).
TESTBED_BINARIES=(etcd kwok kube-apiserver kube-controller-manager kube-scheduler kubectl)
TESTBED_NODE_BINARIES=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr coredns crictl)
# A third group, the tools the tests drive (helm), with its own key likewise.
TESTBED_TOOL_BINARIES=(helm)

# The version key of a cache directory: a hash of the group's pinned versions, its wrapper modules'
# go.mod/go.sum, its build flags and the Go toolchain pin.
testbed_hash() { # text module-dir...
  local text="$1" d; shift
  { echo "$text GOTOOLCHAIN_VERSION=${GOTOOLCHAIN_VERSION:-}"
    for d in "$@"; do cat "$TESTBED_SRC/gomod/$d/go.mod" "$TESTBED_SRC/gomod/$d/go.sum"; done
  } | sha256sum | cut -c1-12
}
testbed_cache_key() {
  printf 'k8s-%s-etcd-%s-kwok-%s-%s' "$KUBERNETES_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" \
    "$(testbed_hash "$KUBERNETES_VERSION $ETCD_VERSION $KWOK_VERSION $TESTBED_GO_TAGS $TESTBED_K8S_LDFLAGS $TESTBED_ETCD_LDFLAGS $TESTBED_KWOK_LDFLAGS" kubernetes etcd kwok)"
}
testbed_node_cache_key() {
  printf 'node-k8s-%s-containerd-%s-coredns-%s-%s' "$KUBERNETES_VERSION" "$CONTAINERD_VERSION" "$COREDNS_VERSION" \
    "$(testbed_hash "$KUBERNETES_VERSION $CONTAINERD_VERSION $COREDNS_VERSION $CRI_TOOLS_VERSION $TESTBED_GO_TAGS $TESTBED_K8S_LDFLAGS $TESTBED_CONTAINERD_TAGS $TESTBED_CONTAINERD_LDFLAGS $TESTBED_COREDNS_LDFLAGS $TESTBED_CRICTL_LDFLAGS" kubelet containerd coredns cri-tools)"
}
testbed_tools_cache_key() {
  printf 'tools-helm-%s-%s' "$HELM_VERSION" "$(testbed_hash "$HELM_VERSION $TESTBED_HELM_LDFLAGS" helm)"
}
TESTBED_CACHE="${DBOP_TESTBED_CACHE:-$HOME/.cache/dbop-testbed}"
# DBOP_TESTBED_BIN_DIR / DBOP_TESTBED_NODE_BIN_DIR / DBOP_TESTBED_TOOLS_BIN_DIR override where the binaries are taken from.
testbed_bin_dir() {
  if [[ -n "${DBOP_TESTBED_BIN_DIR:-}" ]]; then printf '%s' "$DBOP_TESTBED_BIN_DIR"
  else printf '%s/%s/bin' "$TESTBED_CACHE" "$(testbed_cache_key)"; fi
}
testbed_node_bin_dir() {
  if [[ -n "${DBOP_TESTBED_NODE_BIN_DIR:-}" ]]; then printf '%s' "$DBOP_TESTBED_NODE_BIN_DIR"
  else printf '%s/%s/bin' "$TESTBED_CACHE" "$(testbed_node_cache_key)"; fi
}

testbed_tools_bin_dir() {
  if [[ -n "${DBOP_TESTBED_TOOLS_BIN_DIR:-}" ]]; then printf '%s' "$DBOP_TESTBED_TOOLS_BIN_DIR"
  else printf '%s/%s/bin' "$TESTBED_CACHE" "$(testbed_tools_cache_key)"; fi
}

# Seconds since $1 (an epoch with fraction), one decimal.
elapsed() { awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $1}"; }

# The real node (kubelet + containerd beside the kwok nodes) needs root, overlayfs, cgroups, runc,
# the CNI plugins and iptables. Prints why it cannot run here and returns 0, or returns 1 when it
# can. DBOP_TESTBED_REAL_NODE=0 turns it off, =1 skips the checks (up.sh then fails loudly).
TESTBED_CNI_BIN_DIR="${DBOP_TESTBED_CNI_BIN_DIR:-/usr/lib/cni}"
real_node_unavailable() {
  case "${DBOP_TESTBED_REAL_NODE:-auto}" in
    0) echo "turned off by DBOP_TESTBED_REAL_NODE=0"; return 0 ;;
    1) return 1 ;;
  esac
  if [[ $(id -u) -ne 0 ]]; then echo "not root (kubelet and containerd need root)"; return 0; fi
  grep -qw overlay /proc/filesystems 2>/dev/null || modprobe overlay 2>/dev/null ||
    { echo "no overlayfs in /proc/filesystems"; return 0; }
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || { echo "no cgroup hierarchy under /sys/fs/cgroup"; return 0; }
  local t
  for t in runc iptables ip nsenter; do
    command -v "$t" >/dev/null || { echo "missing $t: run e2e/testbed/install-deps.sh (as root)"; return 0; }
  done
  for t in bridge host-local loopback portmap; do
    [[ -x "$TESTBED_CNI_BIN_DIR/$t" ]] || { echo "missing the CNI plugin $TESTBED_CNI_BIN_DIR/$t: run e2e/testbed/install-deps.sh (as root)"; return 0; }
  done
  return 1
}

# The CNI config of a real node's pod network: a bridge with host-local addresses, portmap and
# loopback. Usage: testbed_cni_conflist NAME BRIDGE IPAM_DIR SUBNET GATEWAY > FILE
testbed_cni_conflist() {
  cat <<CNI
{
  "cniVersion": "1.0.0",
  "name": "$1",
  "plugins": [
    {"type": "bridge", "bridge": "$2", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$3",
              "ranges": [[{"subnet": "$4", "gateway": "$5"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
CNI
}
