#!/usr/bin/env bash
# Builds the real node's container images without Docker or a registry, as OCI image tarballs
# (hand-written OCI layout: one gzip layer, a config, a manifest, an index naming the image),
# cached in ${DBOP_TESTBED_CACHE:-$HOME/.cache/dbop-testbed}/images/ under a hash of their inputs.
# Prints one line "<image-ref> <tarball>" per image on stdout (logs on stderr); up.sh imports them
# with `ctr -n k8s.io images import`.
#
#   dbop.local/postgres:15.18, dbop.local/postgres:15.20
#                              PostgreSQL from Debian 12's packages (POSTGRES_DEBIAN_VERSIONS in
#                              versions.env), the official images' layout: /usr/lib/postgresql/15/bin
#                              on PATH, user postgres uid/gid 999, PGDATA /var/lib/postgresql/data;
#                              no entrypoint script (dbop's dbop-instance is the entrypoint);
#                              libnss-wrapper, as the official Debian images have it.
#   dbop.local/cloudnative-pg/postgresql:15.18, dbop.local/alpine/postgres:15.18-alpine
#                              the first version's rootfs again with postgres as uid/gid 26
#                              (CloudNativePG's) and 70 (Alpine's, without libnss_wrapper.so):
#                              operand images whose user is not 999 (e2e/tests/operand_images.rs)
#   dbop.local/s3s-fs:<v>      the S3 server s3s-fs (from PATH or ~/.cargo/bin) and its shared libraries
#   dbop.local/socat:<v>       socat (Debian's, from the host) and its shared libraries: a TLS front
#                              for s3s-fs in the data-plane suite
#   dbop.local/pause:testbed   the sandbox image (a static Go program: images/pause)
#   dbop.local/dbop:dev        dbop, dbop-backup and dbop-instance in /usr/local/bin, each from the
#                              first directory of DBOP_IMAGE_BIN_DIR (':'-separated, default
#                              <repo>/target/release) that has it, with their shared libraries, and
#                              `cp` (the init containers copy the binaries into pods with it)
#
#   dbop.local/dbop:<version>  `release` only (never by default): the Dockerfile's image, an index of
#                              linux/amd64 and linux/arm64, from the static binaries of `make static`
#                              (build_release below)
#
# Usage: images.sh [postgres] [s3s-fs] [socat] [pause] [dbop] [release]   (default: all but release;
# dbop only when its binaries exist)
# Needs root (files owned by uid 999 in the postgres image), apt-get (Debian), jq, ldd, ldconfig.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGES="$TESTBED_CACHE/images"
mkdir -p "$IMAGES"
exec 6>"$IMAGES/.lock"
flock 6
SELF_HASH="$(sha256sum "$TESTBED_SRC/images.sh" | cut -c1-64)"
WORK="$(mktemp -d "$IMAGES/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# oci_manifest dir rootfs config-json arch: writes the layer, config and manifest blobs of one image
# into the layout dir and prints the manifest's descriptor (JSON).
oci_manifest() {
  local d="$1" rootfs="$2" cfg="$3" arch="$4" diffid ldig lsize cdig csize mdig msize
  mkdir -p "$d/blobs/sha256"
  tar -C "$rootfs" --sort=name --mtime=@0 --numeric-owner --xattrs-exclude='*' -cf "$d/layer.tar" .
  diffid="$(sha256sum < "$d/layer.tar" | cut -d' ' -f1)"
  gzip -n -1 "$d/layer.tar"
  ldig="$(sha256sum < "$d/layer.tar.gz" | cut -d' ' -f1)"; lsize=$(stat -c %s "$d/layer.tar.gz")
  mv "$d/layer.tar.gz" "$d/blobs/sha256/$ldig"
  jq -cn --argjson c "$cfg" --arg diff "sha256:$diffid" --arg arch "$arch" \
    '{architecture:$arch, os:"linux", config:$c, rootfs:{type:"layers", diff_ids:[$diff]}}' > "$d/config.json"
  cdig="$(sha256sum < "$d/config.json" | cut -d' ' -f1)"; csize=$(stat -c %s "$d/config.json")
  mv "$d/config.json" "$d/blobs/sha256/$cdig"
  jq -cn --arg cd "sha256:$cdig" --argjson cs "$csize" --arg ld "sha256:$ldig" --argjson ls "$lsize" \
    '{schemaVersion:2, mediaType:"application/vnd.oci.image.manifest.v1+json",
      config:{mediaType:"application/vnd.oci.image.config.v1+json", digest:$cd, size:$cs},
      layers:[{mediaType:"application/vnd.oci.image.layer.v1.tar+gzip", digest:$ld, size:$ls}]}' > "$d/manifest.json"
  mdig="$(sha256sum < "$d/manifest.json" | cut -d' ' -f1)"; msize=$(stat -c %s "$d/manifest.json")
  mv "$d/manifest.json" "$d/blobs/sha256/$mdig"
  jq -cn --arg md "sha256:$mdig" --argjson ms "$msize" '{mediaType:"application/vnd.oci.image.manifest.v1+json", digest:$md, size:$ms}'
}
# oci_layout ref dir out descriptor t0: index.json naming the image (the descriptor of a manifest or
# of an image index), then the tarball; older builds of the same image are removed.
oci_layout() {
  local ref="$1" d="$2" out="$3" desc="$4" t0="$5"
  jq -cn --argjson desc "$desc" --arg ref "$ref" --arg tag "${ref##*:}" \
    '{schemaVersion:2, mediaType:"application/vnd.oci.image.index.v1+json",
      manifests:[$desc + {annotations:{"io.containerd.image.name":$ref, "org.opencontainers.image.ref.name":$tag}}]}' > "$d/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$d/oci-layout"
  tar -C "$d" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.tmp" oci-layout index.json blobs
  mv -f "$out.tmp" "$out"
  # Older builds of the same image (other inputs) are of no use any more.
  find "$IMAGES" -maxdepth 1 -type f -name "$(sed 's/-[0-9a-f]\{12\}\.tar$/-*.tar/' <<<"${out##*/}")" ! -name "${out##*/}" -delete
  log "image $ref: $(du -h "$out" | cut -f1) in $(elapsed "$t0")s"
}
# oci_image ref rootfs out config-json: writes an OCI image layout tarball of one layer (amd64).
oci_image() {
  local ref="$1" rootfs="$2" out="$3" cfg="$4" d="$WORK/oci" t0 desc
  t0=$(date +%s.%N)
  rm -rf "$d"; mkdir -p "$d"
  desc="$(oci_manifest "$d" "$rootfs" "$cfg" amd64)"
  oci_layout "$ref" "$d" "$out" "$desc" "$t0"
}
# oci_multiarch_image ref out config-json arch=rootfs...: one image per architecture (linux), under
# an image index that names each platform, as `docker buildx build --platform …` writes it.
oci_multiarch_image() {
  local ref="$1" out="$2" cfg="$3" d="$WORK/oci" t0 arch rootfs descs=() idig isize; shift 3
  t0=$(date +%s.%N)
  rm -rf "$d"; mkdir -p "$d"
  for arch in "$@"; do
    rootfs="${arch#*=}"; arch="${arch%%=*}"
    descs+=("$(oci_manifest "$d" "$rootfs" "$cfg" "$arch" | jq -c --arg a "$arch" '. + {platform:{architecture:$a, os:"linux"}}')")
  done
  printf '%s\n' "${descs[@]}" | jq -cs '{schemaVersion:2, mediaType:"application/vnd.oci.image.index.v1+json", manifests:.}' > "$d/image-index.json"
  idig="$(sha256sum < "$d/image-index.json" | cut -d' ' -f1)"; isize=$(stat -c %s "$d/image-index.json")
  mv "$d/image-index.json" "$d/blobs/sha256/$idig"
  oci_layout "$ref" "$d" "$out" "$(jq -cn --arg id "sha256:$idig" --argjson is "$isize" \
    '{mediaType:"application/vnd.oci.image.index.v1+json", digest:$id, size:$is}')" "$t0"
}

# The shared libraries a dynamically linked binary needs, with the loader (for images of host binaries).
copy_with_libs() { # rootfs dest-dir binary...
  local root="$1" dest="$2" b lib; shift 2
  mkdir -p "$root$dest"
  for b in "$@"; do
    install -m 0755 "$b" "$root$dest/"
    while read -r lib; do
      [[ -n "$lib" && -e "$lib" ]] || continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done < <(ldd "$b" 2>/dev/null | grep -o '/[^ ]*' || true)
  done
}
base_files() { # rootfs: /etc/passwd, group, nsswitch, hosts-less tmp
  local root="$1"
  mkdir -p "$root/etc" "$root/tmp" "$root/var/tmp"
  chmod 1777 "$root/tmp" "$root/var/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\nnogroup:x:65534:\n' > "$root/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"
}

# --- PostgreSQL from Debian packages -----------------------------------------------------------
# The package closure of the server, client and a shell, minus what only maintainer scripts,
# Debian's cluster wrappers (postgresql-common, perl) or the installer use.
PG_EXCLUDE=' adduser cdebconf debconf dpkg install-info libdebian-installer4 libnewt0.52 libslang2 libtextwrap1
  locales locales-all perl perl-base perl-modules-5.36 libperl5.36 libjson-perl libgdbm6 libgdbm-compat4 libdb5.3
  postgresql-common postgresql-client-common ssl-cert sysvinit-utils ucf lsb-base passwd libsemanage-common
  libsemanage2 libsepol2 libelogind0 '
PG_CLOSURE=()
# amd64 only, whatever foreign architectures the host's dpkg has (with arm64 added, the closure
# names `…:arm64` packages and the image gets arm64 psql and pg_isready).
APT_ARCH=(-o 'APT::Architectures::=amd64')
pg_packages() { # debian-version -> "name=version" lines (pinned server, client and libpq)
  local v="$1" p
  if ((${#PG_CLOSURE[@]} == 0)); then # (the names are the same for every version: resolve once)
    mapfile -t PG_CLOSURE < <(apt-cache "${APT_ARCH[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances --no-pre-depends \
        postgresql-15 libnss-wrapper bash dash coreutils libc-bin grep sed findutils procps 2>/dev/null | grep -v '^[ <]' | sort -u)
  fi
  for p in "${PG_CLOSURE[@]}"; do
    [[ "$PG_EXCLUDE" == *" $p "* ]] && continue
    case "$p" in
      postgresql-15 | postgresql-client-15 | libpq5) echo "$p=$v" ;;
      *) echo "$p" ;;
    esac
  done
}
# postgres_config minor: the image config of the PostgreSQL images.
postgres_config() {
  jq -cn --arg v "$1" '{
      Env:["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/lib/postgresql/15/bin",
           "LANG=C.UTF-8", "PG_MAJOR=15", ("PG_VERSION=" + $v), "PGDATA=/var/lib/postgresql/data"],
      Cmd:["postgres"], StopSignal:"SIGINT", WorkingDir:"/",
      Labels:{"org.opencontainers.image.title":"PostgreSQL from Debian 12 packages (dbop test bed)"}}'
}
# postgres_variant rootfs uid ref out wrapper(keep|drop) minor: the rootfs with its postgres user
# and files moved to uid/gid `uid` (and libnss_wrapper.so removed with `drop`), as an image.
postgres_variant() {
  local root="$1" uid="$2" ref="$3" out="$4" wrapper="$5" minor="$6"
  sed -i "s/^postgres:x:[0-9]*:[0-9]*:/postgres:x:$uid:$uid:/" "$root/etc/passwd"
  sed -i "s/^postgres:x:[0-9]*:/postgres:x:$uid:/" "$root/etc/group"
  chown -R "$uid:$uid" "$root/var/lib/postgresql" "$root/var/run/postgresql"
  [[ "$wrapper" == keep ]] || find "$root" -name 'libnss_wrapper.so*' -delete
  oci_image "$ref" "$root" "$out" "$(postgres_config "$minor")"
}
build_postgres() { # debian-version
  local v="$1" minor ref out key uris root dl cnpg alpine cnpg_out alpine_out variants=0
  minor="${v%%-*}"; ref="dbop.local/postgres:$minor"
  # The images of another uid: from the first version only (one more tarball each, no download).
  [[ "$v" == "${POSTGRES_DEBIAN_VERSIONS%% *}" ]] && variants=1
  cnpg="dbop.local/cloudnative-pg/postgresql:$minor"; alpine="dbop.local/alpine/postgres:$minor-alpine"
  pg_packages "$v" >/dev/null # (fills PG_CLOSURE in this shell, not in a subshell)
  mapfile -t pkgs < <(pg_packages "$v")
  uris="$(cd "$WORK" && apt-get "${APT_ARCH[@]}" download --print-uris "${pkgs[@]}" 2>&1)" ||
    die "apt-get download --print-uris failed for PostgreSQL $v (run apt-get update; is bookworm-security in the sources?): $(tail -n 3 <<<"$uris")"
  key="$( { echo "$SELF_HASH"; sed -n "s/^'[^']*' \([^ ]*\) .*/\1/p" <<<"$uris" | sort; } | sha256sum | cut -c1-12)"
  out="$IMAGES/postgres-$minor-$key.tar"
  cnpg_out="$IMAGES/postgres_cnpg-$minor-$key.tar"; alpine_out="$IMAGES/postgres_alpine-$minor-$key.tar"
  if [[ -f "$out" ]] && { ((variants == 0)) || [[ -f "$cnpg_out" && -f "$alpine_out" ]]; }; then
    echo "$ref $out"
    ((variants == 0)) || printf '%s %s\n%s %s\n' "$cnpg" "$cnpg_out" "$alpine" "$alpine_out"
    return
  fi
  log "building $ref from ${#pkgs[@]} Debian packages"
  dl="$WORK/debs-$minor"; root="$WORK/rootfs-$minor"
  mkdir -p "$dl" "$root"
  (cd "$dl" && apt-get "${APT_ARCH[@]}" download -q "${pkgs[@]}" >/dev/null 2>"$WORK/apt.log") ||
    die "apt-get download failed: $(tail -n 5 "$WORK/apt.log")"
  for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$root"; done
  rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" "$root/usr/share/lintian"
  base_files "$root"
  ldconfig -r "$root" 2>/dev/null || true
  [[ -x "$root/bin/sh" ]] || ln -s dash "$root/bin/sh"
  mkdir -p "$root/var/lib/postgresql/data" "$root/var/run/postgresql"
  chown -R 999:999 "$root/var/lib/postgresql" "$root/var/run/postgresql"
  chmod 2777 "$root/var/run/postgresql"; chmod 0700 "$root/var/lib/postgresql/data"
  "$root/usr/lib/postgresql/15/bin/postgres" --version >/dev/null 2>&1 || true # (host libs; checked in the pod)
  [[ -f "$out" ]] || oci_image "$ref" "$root" "$out" "$(postgres_config "$minor")"
  echo "$ref $out"
  if ((variants)); then
    # CloudNativePG's images are the official Debian ones with `usermod -u 26 postgres`.
    postgres_variant "$root" 26 "$cnpg" "$cnpg_out" keep "$minor"
    postgres_variant "$root" 70 "$alpine" "$alpine_out" drop "$minor"
    printf '%s %s\n%s %s\n' "$cnpg" "$cnpg_out" "$alpine" "$alpine_out"
  fi
  rm -rf "$dl" "$root"
}

# --- s3s-fs ------------------------------------------------------------------------------------
build_s3s() {
  local bin ver ref key out root
  bin="$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")"
  [[ -x "$bin" ]] || die "s3s-fs not found (backups/install-test-deps.sh installs it with cargo)"
  ver="$("$bin" --version 2>/dev/null | awk '{print $NF}')"; ver="${ver:-unknown}"
  ref="dbop.local/s3s-fs:$ver"
  key="$( { echo "$SELF_HASH"; sha256sum < "$bin"; } | sha256sum | cut -c1-12)"
  out="$IMAGES/s3s-fs-$ver-$key.tar"
  if [[ ! -f "$out" ]]; then
    root="$WORK/rootfs-s3s"; base_files "$root"; mkdir -p "$root/data"
    copy_with_libs "$root" /usr/local/bin "$bin"
    oci_image "$ref" "$root" "$out" '{"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"Entrypoint":["/usr/local/bin/s3s-fs"],"WorkingDir":"/"}'
  fi
  echo "$ref $out"
}

# --- socat: a TLS front ------------------------------------------------------------------------
# s3s-fs serves plain HTTP only; the data-plane suite puts socat in front of it (a sidecar that
# terminates TLS with a certificate of a private CA) to test HTTPS with `s3.ca`.
build_socat() {
  local bin ver ref key out root
  bin="$(command -v socat)" || die "socat not found (e2e/testbed/install-deps.sh installs it)"
  ver="$(socat -V 2>/dev/null | sed -n 's/^socat version \([^ ]*\).*/\1/p')"; ver="${ver:-unknown}"
  ref="dbop.local/socat:$ver"
  key="$( { echo "$SELF_HASH"; sha256sum < "$bin"; } | sha256sum | cut -c1-12)"
  out="$IMAGES/socat-$ver-$key.tar"
  if [[ ! -f "$out" ]]; then
    root="$WORK/rootfs-socat"; base_files "$root"
    copy_with_libs "$root" /usr/bin "$bin"
    oci_image "$ref" "$root" "$out" '{"Env":["PATH=/usr/bin:/bin"],"Entrypoint":["/usr/bin/socat"],"WorkingDir":"/"}'
  fi
  echo "$ref $out"
}

# --- pause ------------------------------------------------------------------------------------
build_pause() {
  local ref="dbop.local/pause:testbed" key out root
  key="$(cat "$TESTBED_SRC/images.sh" "$TESTBED_SRC/images/pause/main.go" "$TESTBED_SRC/images/pause/go.mod" | sha256sum | cut -c1-12)"
  out="$IMAGES/pause-$key.tar"
  if [[ ! -f "$out" ]]; then
    root="$WORK/rootfs-pause"; mkdir -p "$root"
    (cd "$TESTBED_SRC/images/pause" && go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$root/pause" .) ||
      die "building the pause program failed"
    oci_image "$ref" "$root" "$out" '{"Entrypoint":["/pause"],"User":"65535:65535"}'
  fi
  echo "$ref $out"
}

# --- dbop ---------------------------------------------------------------------------------------
# DBOP_IMAGE_BIN_DIR is a list of directories separated by ':'; each binary is taken from the first
# that has it (e.g. a static musl dbop-instance first, then the workspace's target/debug).
dbop_bin() { # name -> path of the first DBOP_IMAGE_BIN_DIR entry holding it
  local d dirs
  IFS=: read -ra dirs <<<"${DBOP_IMAGE_BIN_DIR:-$REPO_ROOT/target/release}"
  for d in "${dirs[@]}"; do [[ -x "$d/$1" ]] && { printf '%s' "$d/$1"; return 0; }; done
  return 1
}
build_dbop() {
  local ref="dbop.local/dbop:dev" bins=() key out root b p cp_bin
  for b in dbop dbop-backup dbop-instance; do
    if p="$(dbop_bin "$b")"; then bins+=("$p"); else
      log "no dbop image: no $b in ${DBOP_IMAGE_BIN_DIR:-$REPO_ROOT/target/release} (cargo build --bins, or set DBOP_IMAGE_BIN_DIR)"
      return 0
    fi
  done
  # The init containers of database and backup pods run `cp` from this image.
  cp_bin="$(command -v cp)"
  key="$( { echo "$SELF_HASH"; sha256sum "${bins[@]}" "$cp_bin" | cut -c1-64; } | sha256sum | cut -c1-12)"
  out="$IMAGES/dbop-dev-$key.tar"
  if [[ ! -f "$out" ]]; then
    root="$WORK/rootfs-dbop"; base_files "$root"
    copy_with_libs "$root" /usr/local/bin "${bins[@]}"
    copy_with_libs "$root" /usr/bin "$cp_bin"
    if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
      mkdir -p "$root/etc/ssl/certs"; cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    fi
    oci_image "$ref" "$root" "$out" '{"Env":["PATH=/usr/local/bin:/usr/bin:/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"Entrypoint":["/usr/local/bin/dbop"],"User":"65532:65532"}'
  fi
  echo "$ref $out"
}

# --- dbop's release image -----------------------------------------------------------------------
# What the Dockerfile describes, without Docker: an image index of linux/amd64 and linux/arm64 (the
# Dockerfile's DBOP_ARCHES), each image with its architecture's static binaries of `make static`
# in /usr/local/bin, root-owned 0755, busybox's static `cp` at /usr/bin/cp (the host's for amd64,
# busybox-static:arm64's for arm64), a passwd with distroless's nonroot (65532), the CA bundle;
# user 65532:65532, entrypoint dbop, command `run`. check-image.sh then compares it with the
# Dockerfile (platforms, paths, owners, modes, static binaries of the right architecture, user,
# entrypoint, cmd). DBOP_RELEASE_BIN_DIR is the amd64 binaries' directory (default
# target/x86_64-unknown-linux-musl/release), DBOP_RELEASE_ARM64_BIN_DIR the arm64 ones' (default:
# aarch64-unknown-linux-musl/release beside it).
release_bins() { # dir -> the three binaries' paths, each checked static
  local b
  for b in dbop dbop-backup dbop-instance; do
    [[ -x "$1/$b" ]] || die "no $1/$b: run make static first (or set DBOP_RELEASE_BIN_DIR / DBOP_RELEASE_ARM64_BIN_DIR)"
    file -L "$1/$b" | grep -Eq 'statically linked|static-pie linked' || die "$1/$b is not static: $(file -L "$1/$b")"
    echo "$1/$b"
  done
}
arm64_busybox() { # -> busybox-static:arm64's busybox, extracted once into the images cache
  local ver deb dir
  ver="$(apt-cache show --no-all-versions busybox-static:arm64 2>/dev/null | sed -n 's/^Version: //p')"
  [[ -n "$ver" ]] || die "no busybox-static:arm64 in apt (dpkg --add-architecture arm64 && apt-get update; e2e/testbed/install-deps.sh)"
  dir="$IMAGES/busybox-static-arm64-${ver//[^A-Za-z0-9.+-]/_}"
  if [[ ! -x "$dir/bin/busybox" ]]; then
    (cd "$WORK" && apt-get download -q "busybox-static:arm64=$ver" >/dev/null 2>"$WORK/apt.log") ||
      die "apt-get download busybox-static:arm64 failed: $(tail -n 3 "$WORK/apt.log")"
    deb="$(echo "$WORK"/busybox-static_*_arm64.deb)"
    rm -rf "$dir.tmp"; dpkg-deb -x "$deb" "$dir.tmp" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir/bin/busybox"
}
release_rootfs() { # root cp-binary binary... : the release image's files
  local root="$1" cp_bin="$2" b; shift 2
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/usr/local/bin" "$root/usr/bin"
  chmod 1777 "$root/tmp"
  chown 65532:65532 "$root/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$root/etc/group"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  for b in "$@"; do install -o 0 -g 0 -m 0755 "$b" "$root/usr/local/bin/"; done
  install -o 0 -g 0 -m 0755 "$cp_bin" "$root/usr/bin/cp"
}
build_release() {
  local amd64="${DBOP_RELEASE_BIN_DIR:-$REPO_ROOT/target/x86_64-unknown-linux-musl/release}" arm64
  local version ref amd64_bins arm64_bins key out busybox=/bin/busybox arm64_busybox
  arm64="${DBOP_RELEASE_ARM64_BIN_DIR:-$(dirname "$(dirname "$amd64")")/aarch64-unknown-linux-musl/release}"
  version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -n 1)"
  ref="dbop.local/dbop:$version"
  mapfile -t amd64_bins < <(release_bins "$amd64"); ((${#amd64_bins[@]} == 3)) || exit 1
  mapfile -t arm64_bins < <(release_bins "$arm64"); ((${#arm64_bins[@]} == 3)) || exit 1
  [[ -x "$busybox" ]] || die "no $busybox: e2e/testbed/install-deps.sh installs busybox-static"
  arm64_busybox="$(arm64_busybox)" || exit 1
  key="$( { echo "$SELF_HASH"; sha256sum "${amd64_bins[@]}" "${arm64_bins[@]}" "$busybox" "$arm64_busybox" /etc/ssl/certs/ca-certificates.crt | cut -c1-64; } | sha256sum | cut -c1-12)"
  out="$IMAGES/dbop-release-$key.tar"
  if [[ ! -f "$out" ]]; then
    release_rootfs "$WORK/rootfs-release-amd64" "$busybox" "${amd64_bins[@]}"
    release_rootfs "$WORK/rootfs-release-arm64" "$arm64_busybox" "${arm64_bins[@]}"
    oci_multiarch_image "$ref" "$out" "$(jq -cn --arg v "$version" '{
      User: "65532:65532", Entrypoint: ["/usr/local/bin/dbop"], Cmd: ["run"],
      Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
      Labels: {"org.opencontainers.image.title": "dbop", "org.opencontainers.image.version": $v,
               "org.opencontainers.image.licenses": "Apache-2.0"}}')" \
      amd64="$WORK/rootfs-release-amd64" arm64="$WORK/rootfs-release-arm64"
  fi
  "$TESTBED_SRC/check-image.sh" "$out" >&2 || die "the release image $out does not match the Dockerfile"
  echo "$ref $out"
}

which=("$@")
((${#which[@]})) || which=(pause postgres s3s-fs socat dbop)
[[ $(id -u) -eq 0 ]] || die "images.sh needs root (the postgres image holds files owned by uid 999)"
for t in jq apt-get dpkg-deb ldconfig ldd; do command -v "$t" >/dev/null || die "missing $t (e2e/testbed/install-deps.sh)"; done
for w in "${which[@]}"; do
  case "$w" in
    postgres) for v in $POSTGRES_DEBIAN_VERSIONS; do build_postgres "$v"; done ;;
    s3s-fs) build_s3s ;;
    socat) build_socat ;;
    pause) build_pause ;;
    dbop) build_dbop ;;
    release) build_release ;;
    *) die "unknown image $w (postgres, s3s-fs, socat, pause, dbop, release)" ;;
  esac
done
