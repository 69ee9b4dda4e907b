#!/usr/bin/env bash
# Builds dbop's image dbop.local/dbop:dev from freshly built binaries (images.sh dbop, from
# DBOP_IMAGE_BIN_DIR) and imports it into the running real node, replacing the one up.sh imported
# (which was built from whatever binaries existed then). `make run` and `make test-e2e` call it
# after `up.sh`, so the pods run the code under test. Nothing to do without a real node.
#
# Usage: DBOP_IMAGE_BIN_DIR=dir[:dir...] e2e/testbed/dbop-image.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
NODE_DIR="$DIR/node"
SOCK="$NODE_DIR/containerd/containerd.sock"
[[ -S "$SOCK" && -f "$NODE_DIR/images.list" ]] || { log "dbop image: no real node in $DIR, nothing to load"; exit 0; }

t0=$(date +%s.%N)
line="$("$TESTBED_SRC/images.sh" dbop 2>>"$DIR/logs/images.log")" ||
  die "building dbop.local/dbop:dev failed (log: $DIR/logs/images.log)"
[[ -n "$line" ]] || die "no dbop image built: $(tail -n 1 "$DIR/logs/images.log")"
read -r ref tar <<<"$line"
"$(testbed_node_bin_dir)/ctr" --address "$SOCK" -n k8s.io images import --local "$tar" >>"$DIR/logs/images.log" 2>&1 ||
  die "importing $tar ($ref) failed: see $DIR/logs/images.log"
# The list the tests read (TestBed::real_node_image): this image's line replaced.
{ grep -v "^$ref " "$NODE_DIR/images.list" || true; echo "$line"; } > "$NODE_DIR/images.list.tmp"
mv "$NODE_DIR/images.list.tmp" "$NODE_DIR/images.list"
log "dbop image: $ref from ${DBOP_IMAGE_BIN_DIR:-$REPO_ROOT/target/release} imported in $(elapsed "$t0")s"
