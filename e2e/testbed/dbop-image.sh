#!/usr/bin/env bash
# Builds dbop's images from freshly built binaries and imports them into the running real node,
# replacing what up.sh imported (built from whatever binaries existed then). `make run` and
# `make test-e2e` call it after `up.sh`, so the pods run the code under test:
#   dev      dbop.local/dbop:dev (images.sh dbop, from DBOP_IMAGE_BIN_DIR: the debug binaries)
#   release  dbop.local/dbop:<version> (images.sh release, from `make static`'s binaries): the
#            image the Dockerfile describes, which the in-cluster Helm install runs
# Nothing to do without a real node.
#
# Usage: DBOP_IMAGE_BIN_DIR=dir[:dir...] e2e/testbed/dbop-image.sh [dev] [release]   (default: dev)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
NODE_DIR="$DIR/node"
SOCK="$NODE_DIR/containerd/containerd.sock"
[[ -S "$SOCK" && -f "$NODE_DIR/images.list" ]] || { log "dbop image: no real node in $DIR, nothing to load"; exit 0; }

# Builds one image (images.sh IMAGE) and imports it into the node's containerd.
load() {
  local what=$1 t0 line ref tar
  t0=$(date +%s.%N)
  line="$("$TESTBED_SRC/images.sh" "$what" 2>>"$DIR/logs/images.log")" ||
    die "building dbop's $what image failed (log: $DIR/logs/images.log)"
  [[ -n "$line" ]] || die "no dbop $what image built: $(tail -n 1 "$DIR/logs/images.log")"
  read -r ref tar <<<"$line"
  "$(testbed_node_bin_dir)/ctr" --address "$SOCK" -n k8s.io images import --local "$tar" >>"$DIR/logs/images.log" 2>&1 ||
    die "importing $tar ($ref) failed: see $DIR/logs/images.log"
  # The list the tests read (TestBed::real_node_image): this image's line replaced.
  { grep -v "^$ref " "$NODE_DIR/images.list" || true; echo "$line"; } > "$NODE_DIR/images.list.tmp"
  mv "$NODE_DIR/images.list.tmp" "$NODE_DIR/images.list"
  log "dbop image: $ref imported in $(elapsed "$t0")s"
}

which=("$@")
((${#which[@]})) || which=(dev)
for w in "${which[@]}"; do
  case "$w" in
    dev) load dbop ;;
    release) load release ;;
    *) die "unknown image $w (dev, release)" ;;
  esac
done
