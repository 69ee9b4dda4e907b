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

# The version key of the binary cache: a hash of versions.env and every wrapper module's go.sum,
# so a change of any pinned version or dependency builds into a fresh directory.
# Build flags as upstream builds its release binaries (hack/lib/golang.sh, etcd's build.sh), plus
# -trimpath and -s -w (no symbol table / DWARF: smaller binaries, faster links).
TESTBED_GO_TAGS="selinux,notest,grpcnotrace"
k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
TESTBED_K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  TESTBED_K8S_LDFLAGS+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  TESTBED_K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
TESTBED_ETCD_LDFLAGS="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"
TESTBED_KWOK_LDFLAGS="-s -w"
TESTBED_BINARIES=(etcd kwok kube-apiserver kube-controller-manager kube-scheduler kubectl)

testbed_cache_key() {
  local h
  h="$( { cat "$TESTBED_SRC/versions.env" "$TESTBED_SRC"/gomod/*/go.mod "$TESTBED_SRC"/gomod/*/go.sum
          echo "$TESTBED_GO_TAGS $TESTBED_K8S_LDFLAGS $TESTBED_ETCD_LDFLAGS $TESTBED_KWOK_LDFLAGS"; } | sha256sum | cut -c1-12)"
  printf 'k8s-%s-etcd-%s-kwok-%s-%s' "$KUBERNETES_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$h"
}
TESTBED_CACHE="${DBOP_TESTBED_CACHE:-$HOME/.cache/dbop-testbed}"
# DBOP_TESTBED_BIN_DIR overrides where the binaries are taken from (e.g. a directory of your own).
testbed_bin_dir() {
  if [[ -n "${DBOP_TESTBED_BIN_DIR:-}" ]]; then printf '%s' "$DBOP_TESTBED_BIN_DIR"
  else printf '%s/%s/bin' "$TESTBED_CACHE" "$(testbed_cache_key)"; fi
}
