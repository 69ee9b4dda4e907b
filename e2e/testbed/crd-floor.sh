#!/usr/bin/env bash
# Validates the CRDs (crds/dbop.dev.yaml by default) with the CRD validation code of the oldest
# Kubernetes the chart admits (crd-floor/: k8s.io/apiextensions-apiserver pinned at the kubeVersion
# floor of charts/dbop/Chart.yaml): what that release's API server runs on `kubectl apply`, CEL
# compilation and cost estimation included, without starting one. The program is built once from
# Go modules and cached in ${DBOP_TESTBED_CACHE:-$HOME/.cache/dbop-testbed}/crd-floor-<hash>/;
# a warm run only runs it (~0.3 s). tests/kube_version_floor.rs runs this script; .ci/run builds
# the program beside the Rust builds.
#
# Usage: crd-floor.sh [CRD.yaml...]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
src="$TESTBED_SRC/crd-floor"
floor="$(sed -n 's/^kubeVersion: ">=1\.\([0-9]*\)\..*/\1/p' "$REPO_ROOT/charts/dbop/Chart.yaml")"
pinned="$(sed -n 's/^\tk8s.io\/apiextensions-apiserver v0\.\([0-9]*\)\..*/\1/p; s/^require k8s.io\/apiextensions-apiserver v0\.\([0-9]*\)\..*/\1/p' "$src/go.mod" | head -n 1)"
[[ -n "$floor" && "$floor" == "$pinned" ]] ||
  die "crd-floor/go.mod pins k8s.io/apiextensions-apiserver v0.${pinned:-?}, the chart's kubeVersion floor is 1.${floor:-?}: pin v0.$floor.x (go get k8s.io/apiextensions-apiserver@v0.$floor.0 && go mod tidy in $src)"
key="$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)"
bin="$TESTBED_CACHE/crd-floor-1.$floor-$key/crd-floor"
mkdir -p "$TESTBED_CACHE"
exec 7>"$TESTBED_CACHE/.crd-floor.lock"
flock 7 # (one build at a time; the others wait and find it built)
if [[ ! -x "$bin" ]]; then
  t0=$(date +%s.%N)
  log "building crd-floor (k8s.io/apiextensions-apiserver v0.$floor) into ${bin%/*}"
  mkdir -p "${bin%/*}"
  # Its own Go build cache, removed afterwards (the program is what is kept).
  gocache="$(mktemp -d "$TESTBED_CACHE/crd-floor-gocache.XXXXXX")"
  (cd "$src" && GOCACHE="$gocache" go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$bin.tmp" .) ||
    { rm -rf "$gocache"; die "building crd-floor failed"; }
  rm -rf "$gocache"
  mv "$bin.tmp" "$bin"
  # Older builds (other inputs) are of no use any more.
  find "$TESTBED_CACHE" -maxdepth 1 -type d -name 'crd-floor-*' ! -name "$(basename "${bin%/*}")" -exec rm -rf {} + 2>/dev/null || true
  log "built crd-floor in $(elapsed "$t0")s"
fi
(($#)) || set -- "$REPO_ROOT/crds/dbop.dev.yaml"
"$bin" "$@"
