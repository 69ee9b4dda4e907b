#!/usr/bin/env bash
# Builds the test bed's binaries from the Go module proxy into versioned caches outside the repo,
# ${DBOP_TESTBED_CACHE:-$HOME/.cache/dbop-testbed}/<key>/bin/, two groups with their own keys:
#   control plane: etcd, kwok, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#   node:          kubelet, kube-proxy, containerd, containerd-shim-runc-v2, ctr, coredns, crictl
#   tools:         helm (the chart's tests)
# Binaries already present are skipped. Versions: e2e/testbed/versions.env.
#
# Usage: build.sh [controlplane] [node] [tools]   (default: all; the node group only when the host can run
# the real node, see real_node_unavailable in lib.sh, or DBOP_TESTBED_REAL_NODE=1 forces it;
# DBOP_TESTBED_REAL_NODE=0 skips it).
# Independent binaries are built in two parallel streams (linking is single-threaded; go build
# itself already compiles packages on every core). Each build prints its duration.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v go >/dev/null || die "go is not installed (Debian: the golang-go package is too old; install Go >= 1.26 or set GOTOOLCHAIN_VERSION)"

groups=("$@")
if ((${#groups[@]} == 0)); then
  groups=(controlplane tools)
  if why="$(real_node_unavailable)"; then
    log "not building the real node's binaries: $why"
  else
    groups+=(node)
  fi
fi

# The wrapper modules must match versions.env (they are generated from it by gen-gomod.sh).
requires() { grep -Eq "^[[:space:]]*(require )?$1 $2( |\$)" "$TESTBED_SRC/gomod/$3/go.mod" ||
  die "gomod/$3/go.mod does not require $1 $2: run e2e/testbed/gen-gomod.sh $3"; }
requires k8s.io/kubernetes "$KUBERNETES_VERSION" kubernetes
requires go.etcd.io/etcd/server/v3 "$ETCD_VERSION" etcd
requires sigs.k8s.io/kwok "$KWOK_VERSION" kwok
requires k8s.io/kubernetes "$KUBERNETES_VERSION" kubelet
requires github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" containerd
requires github.com/coredns/coredns "$COREDNS_VERSION" coredns
requires sigs.k8s.io/cri-tools "$CRI_TOOLS_VERSION" cri-tools
requires helm.sh/helm/v4 "$HELM_VERSION" helm

# Go's build cache for these builds grows to ~5 GB and is useless once the binaries exist, so
# unless GOCACHE is set by the caller it lives under the test bed cache and is removed after a
# successful build (DBOP_TESTBED_KEEP_GOCACHE=1 keeps it), unless another build.sh still uses it.
own_gocache=0
if [[ -z "${GOCACHE:-}" ]]; then
  export GOCACHE="$TESTBED_CACHE/go-build"
  own_gocache=1
fi
mkdir -p "$TESTBED_CACHE"
exec 7>"$TESTBED_CACHE/.gocache.lock"
flock -s 7

build_one() { # bin-dir name module-dir package tags ldflags
  local bin="$1" name="$2" dir="$3" pkg="$4" tags="$5" ldflags="$6" t0
  t0=$(date +%s.%N)
  log "building $name ($pkg) ..."
  (cd "$TESTBED_SRC/gomod/$dir" &&
    go build -trimpath -buildvcs=false -tags "$tags" -ldflags "$ldflags" -o "$bin/.$name.tmp" "$pkg") ||
    { log "ERROR: building $name failed"; return 1; }
  mv -f "$bin/.$name.tmp" "$bin/$name"
  log "built $name in $(elapsed "$t0")s ($(du -h "$bin/$name" | cut -f1))"
}
build_named() { # bin-dir name
  local bin="$1" ct="github.com/containerd/containerd/v2/cmd"
  case "$2" in
    etcd) build_one "$bin" etcd etcd . "$TESTBED_GO_TAGS" "$TESTBED_ETCD_LDFLAGS" ;;
    kwok) build_one "$bin" kwok kwok sigs.k8s.io/kwok/cmd/kwok "$TESTBED_GO_TAGS" "$TESTBED_KWOK_LDFLAGS" ;;
    kubelet | kube-proxy) build_one "$bin" "$2" kubelet "k8s.io/kubernetes/cmd/$2" "$TESTBED_GO_TAGS" "$TESTBED_K8S_LDFLAGS" ;;
    containerd | containerd-shim-runc-v2 | ctr)
      build_one "$bin" "$2" containerd "$ct/$2" "$TESTBED_CONTAINERD_TAGS" "$TESTBED_CONTAINERD_LDFLAGS" ;;
    coredns) build_one "$bin" coredns coredns github.com/coredns/coredns "" "$TESTBED_COREDNS_LDFLAGS" ;;
    crictl) build_one "$bin" crictl cri-tools sigs.k8s.io/cri-tools/cmd/crictl "" "$TESTBED_CRICTL_LDFLAGS" ;;
    helm) build_one "$bin" helm helm helm.sh/helm/v4/cmd/helm "" "$TESTBED_HELM_LDFLAGS" ;;
    *) build_one "$bin" "$2" kubernetes "k8s.io/kubernetes/cmd/$2" "$TESTBED_GO_TAGS" "$TESTBED_K8S_LDFLAGS" ;;
  esac
}
build_stream() { # bin-dir name... (one after the other)
  local bin="$1" b; shift
  for b in "$@"; do build_named "$bin" "$b" || return 1; done
}

# Builds the missing binaries of one group into its directory, in two parallel streams.
build_group() { # group-label bin-dir stream-a (space separated) stream-b
  local label="$1" bin="$2" a=() b=() n pa pb ok=1
  mkdir -p "$bin"
  exec 9>"$bin/../.build.lock"
  flock 9 # one build at a time per cache directory
  for n in $3; do [[ -x "$bin/$n" ]] || a+=("$n"); done
  for n in $4; do [[ -x "$bin/$n" ]] || b+=("$n"); done
  if ((${#a[@]} + ${#b[@]} == 0)); then
    log "$label: all binaries present in $bin"
    exec 9>&-; return 0
  fi
  log "$label: building ${a[*]} ${b[*]} into $bin"
  build_stream "$bin" "${a[@]}" & pa=$!
  build_stream "$bin" "${b[@]}" & pb=$!
  wait "$pa" || ok=0
  wait "$pb" || ok=0
  exec 9>&-
  ((ok)) || die "$label: build failed"
}

total0=$(date +%s.%N)
log "go: $(go version) (GOTOOLCHAIN=$GOTOOLCHAIN), GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE)"
for g in "${groups[@]}"; do
  case "$g" in
    controlplane)
      build_group "control plane" "$(testbed_bin_dir)" "kube-apiserver kube-scheduler kubectl" \
        "etcd kwok kube-controller-manager"
      {
        echo "KUBERNETES_VERSION=$KUBERNETES_VERSION"
        echo "ETCD_VERSION=$ETCD_VERSION"
        echo "KWOK_VERSION=$KWOK_VERSION"
        echo "GO=$(go env GOVERSION)"
      } > "$(testbed_bin_dir)/../versions.txt" ;;
    node)
      build_group "node" "$(testbed_node_bin_dir)" "kubelet kube-proxy crictl" \
        "containerd containerd-shim-runc-v2 ctr coredns"
      {
        echo "KUBERNETES_VERSION=$KUBERNETES_VERSION"
        echo "CONTAINERD_VERSION=$CONTAINERD_VERSION"
        echo "COREDNS_VERSION=$COREDNS_VERSION"
        echo "CRI_TOOLS_VERSION=$CRI_TOOLS_VERSION"
        echo "GO=$(go env GOVERSION)"
      } > "$(testbed_node_bin_dir)/../versions.txt" ;;
    tools)
      build_group "tools" "$(testbed_tools_bin_dir)" "helm" ""
      {
        echo "HELM_VERSION=$HELM_VERSION"
        echo "GO=$(go env GOVERSION)"
      } > "$(testbed_tools_bin_dir)/../versions.txt" ;;
    *) die "unknown group $g (controlplane, node, tools)" ;;
  esac
done
if ((own_gocache)) && [[ "${DBOP_TESTBED_KEEP_GOCACHE:-0}" != 1 ]] && [[ -d "$GOCACHE" ]]; then
  # Only when no other build.sh holds the cache (they hold it shared).
  if flock -x -n 7; then
    rm -rf "$GOCACHE"
    log "removed the build cache $GOCACHE (DBOP_TESTBED_KEEP_GOCACHE=1 keeps it)"
  else
    log "kept the build cache $GOCACHE: another build.sh is using it"
  fi
fi
log "build done in $(elapsed "$total0")s (${groups[*]})"
