#!/usr/bin/env bash
# Builds the test bed's control plane from the Go module proxy into a versioned cache outside the
# repo: ${DBOP_TESTBED_CACHE:-$HOME/.cache/dbop-testbed}/<versions-key>/bin/
#   etcd, kwok, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
# Binaries already present there are skipped. Versions: e2e/testbed/versions.env.
# Go module cache: Go's usual GOMODCACHE. Build cache: see below.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v go >/dev/null || die "go is not installed (Debian: the golang-go package is too old; install Go >= 1.26 or set GOTOOLCHAIN_VERSION)"

# The wrapper modules must match versions.env (they are generated from it by gen-gomod.sh).
requires() { grep -Eq "^[[:space:]]*(require )?$1 $2( |\$)" "$TESTBED_SRC/gomod/$3/go.mod"; }
requires k8s.io/kubernetes "$KUBERNETES_VERSION" kubernetes ||
  die "gomod/kubernetes/go.mod does not require k8s.io/kubernetes $KUBERNETES_VERSION: run e2e/testbed/gen-gomod.sh"
requires go.etcd.io/etcd/server/v3 "$ETCD_VERSION" etcd ||
  die "gomod/etcd/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION: run e2e/testbed/gen-gomod.sh"
requires sigs.k8s.io/kwok "$KWOK_VERSION" kwok ||
  die "gomod/kwok/go.mod does not require sigs.k8s.io/kwok $KWOK_VERSION: run e2e/testbed/gen-gomod.sh"

bin="$(testbed_bin_dir)"
mkdir -p "$bin"
# One build at a time per cache directory.
exec 9>"$bin/../.build.lock"
flock 9

missing=()
for b in "${TESTBED_BINARIES[@]}"; do [[ -x "$bin/$b" ]] || missing+=("$b"); done
if ((${#missing[@]} == 0)); then
  log "all binaries present in $bin (kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
  exit 0
fi
# Go's build cache for these builds grows to ~4.5 GB and is useless once the binaries exist, so
# unless GOCACHE is set by the caller it lives under the test bed cache and is removed after a
# successful build (DBOP_TESTBED_KEEP_GOCACHE=1 keeps it). The module cache (~1 GB) is Go's usual one.
own_gocache=0
if [[ -z "${GOCACHE:-}" ]]; then
  export GOCACHE="$TESTBED_CACHE/go-build"
  own_gocache=1
fi
log "building ${missing[*]} into $bin"
log "go: $(go version) (GOTOOLCHAIN=$GOTOOLCHAIN), GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE)"

build_one() { # name module-dir package ldflags
  local name="$1" dir="$2" pkg="$3" ldflags="$4" t0 t1
  t0=$(date +%s)
  log "building $name ($pkg) ..."
  (cd "$TESTBED_SRC/gomod/$dir" &&
    go build -trimpath -buildvcs=false -tags "$TESTBED_GO_TAGS" -ldflags "$ldflags" -o "$bin/.$name.tmp" "$pkg") ||
    die "building $name failed"
  mv -f "$bin/.$name.tmp" "$bin/$name"
  t1=$(date +%s)
  log "built $name in $((t1 - t0))s ($(du -h "$bin/$name" | cut -f1))"
}

total0=$(date +%s)
for b in "${missing[@]}"; do
  case "$b" in
    etcd) build_one etcd etcd . "$TESTBED_ETCD_LDFLAGS" ;;
    kwok) build_one kwok kwok sigs.k8s.io/kwok/cmd/kwok "$TESTBED_KWOK_LDFLAGS" ;;
    *) build_one "$b" kubernetes "k8s.io/kubernetes/cmd/$b" "$TESTBED_K8S_LDFLAGS" ;;
  esac
done
{
  echo "KUBERNETES_VERSION=$KUBERNETES_VERSION"
  echo "ETCD_VERSION=$ETCD_VERSION"
  echo "KWOK_VERSION=$KWOK_VERSION"
  echo "GO=$(go env GOVERSION)"
} > "$bin/../versions.txt"
if ((own_gocache)) && [[ "${DBOP_TESTBED_KEEP_GOCACHE:-0}" != 1 ]]; then
  rm -rf "$GOCACHE"
  log "removed the build cache $GOCACHE (DBOP_TESTBED_KEEP_GOCACHE=1 keeps it)"
fi
log "build done in $(( $(date +%s) - total0 ))s: $bin ($(du -sh "$bin" | cut -f1))"
