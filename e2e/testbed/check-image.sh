#!/usr/bin/env bash
# Checks that an OCI image tarball (images.sh release) is the image the Dockerfile describes: an
# image index naming linux/<arch> for each arch of the Dockerfile's DBOP_ARCHES and nothing else,
# and in each platform's image the files its final stage COPYs (same paths, owner, mode; the
# binaries static and of that platform's architecture), nothing else in /usr/local/bin, and the
# same USER, ENTRYPOINT and CMD. It also checks that the Dockerfile cross-compiles (its build stage
# runs on $BUILDPLATFORM) and that each platform copies its own binaries (/out/${TARGETARCH}/…).
# Exits 1 listing every difference.
#
# Usage: check-image.sh IMAGE.tar [DOCKERFILE]   (default: the repository's Dockerfile)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
image="${1:?usage: check-image.sh IMAGE.tar [DOCKERFILE]}"
dockerfile="${2:-$REPO_ROOT/Dockerfile}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/layout"
tar -C "$work/layout" -xf "$image"
blob() { printf '%s/layout/blobs/sha256/%s' "$work" "${1#sha256:}"; }
problems=()

# The Dockerfile, continuation lines joined; its final stage (after its last FROM).
joined="$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$dockerfile")"
stage="$(awk '/^FROM /{s=""} {s = s $0 "\n"} END{printf "%s", s}' <<<"$joined")"
arches="$(sed -n 's/^ARG DBOP_ARCHES="\(.*\)"$/\1/p' <<<"$joined" | head -n 1)"
[[ -n "$arches" ]] || problems+=('no ARG DBOP_ARCHES="…" (the platforms the Dockerfile builds)')
grep -q '^FROM --platform=\$BUILDPLATFORM .* AS build$' <<<"$joined" ||
  problems+=("the build stage does not run on \$BUILDPLATFORM (FROM --platform=\$BUILDPLATFORM … AS build): it would be emulated")
# "chown chmod src dest" of each COPY of the final stage.
copies="$(sed -n 's/^COPY --from=[^ ]* --chown=\([^ ]*\) --chmod=\([^ ]*\) \([^ ]*\) \([^ ]*\)$/\1 \2 \3 \4/p' <<<"$stage")"
[[ -n "$copies" ]] || problems+=("no COPY --from=… --chown=… --chmod=… SRC DEST line in the Dockerfile's final stage")
while read -r _ _ src dest; do
  [[ -z "$dest" || "$src" == '/out/${TARGETARCH}/'* ]] || problems+=("$dest: COPYed from $src, not from its platform's /out/\${TARGETARCH}/")
done <<<"$copies"

# The platforms of the index: index.json names one image index (multi-arch), whose manifests each
# say their platform.
top="$(jq -r '.manifests[0].mediaType' "$work/layout/index.json")"
declare -A manifest_of=()
if [[ "$top" != application/vnd.oci.image.index.v1+json ]]; then
  problems+=("index.json names a $top, not an image index of the platforms $arches")
else
  while read -r platform digest; do manifest_of[$platform]="$(blob "$digest")"; done < <(
    jq -r '.manifests[] | "\(.platform.os)/\(.platform.architecture) \(.digest)"' "$(blob "$(jq -r '.manifests[0].digest' "$work/layout/index.json")")")
fi
for arch in $arches; do [[ -n "${manifest_of[linux/$arch]:-}" ]] || problems+=("linux/$arch: in the Dockerfile's DBOP_ARCHES, not in the image index"); done
for platform in "${!manifest_of[@]}"; do [[ " $arches " == *" ${platform#linux/} "* ]] || problems+=("$platform: in the image index, not in the Dockerfile's DBOP_ARCHES ($arches)"); done

# What `file` says of a binary of each architecture.
file_arch() { case "$1" in amd64) echo x86-64 ;; arm64) echo 'ARM aarch64' ;; *) echo "unknown architecture $1" ;; esac; }
want_json() { # platform config instruction config-key
  local want got
  want="$(sed -n "s/^$3 //p" <<<"$stage" | tail -n 1)"
  got="$(jq -c ".config.$4" "$2")"
  [[ "$(jq -c . <<<"$want" 2>/dev/null)" == "$got" ]] || problems+=("$1 $3: Dockerfile $want, image $got")
}
perms_of() { # octal mode -> ls-style "-rwxr-xr-x"
  local d
  printf -- '-'
  for d in $(grep -o . <<<"$(sed 's/^0*//' <<<"$1")"); do
    printf '%s%s%s' "$( ((d & 4)) && echo r || echo -)" "$( ((d & 2)) && echo w || echo -)" "$( ((d & 1)) && echo x || echo -)"
  done
}
check_platform() { # platform manifest-path
  local platform="$1" manifest="$2" arch="${1#linux/}" config layer dir user chown chmod dest line perms owner
  config="$(blob "$(jq -r '.config.digest' "$manifest")")"
  layer="$(blob "$(jq -r '.layers[0].digest' "$manifest")")"
  dir="$work/$arch"; mkdir -p "$dir"
  [[ "$(jq -r '"\(.os)/\(.architecture)"' "$config")" == "$platform" ]] ||
    problems+=("$platform: the image config says $(jq -r '"\(.os)/\(.architecture)"' "$config")")
  want_json "$platform" "$config" ENTRYPOINT Entrypoint
  want_json "$platform" "$config" CMD Cmd
  user="$(sed -n 's/^USER //p' <<<"$stage" | tail -n 1)"
  [[ "$(jq -r '.config.User' "$config")" == "$user" ]] || problems+=("$platform USER: Dockerfile $user, image $(jq -r '.config.User' "$config")")
  # "mode owner/group path" of every regular file in the layer.
  tar -tzvf "$layer" --numeric-owner | awk '$1 ~ /^-/ {sub(/^\.\//, "/", $6); print $1, $2, $6}' > "$dir.files"
  declare -A copied=()
  while read -r chown chmod _ dest; do
    [[ -n "$dest" ]] || continue
    copied[$dest]=1
    line="$(awk -v p="$dest" '$3 == p' "$dir.files")"
    if [[ -z "$line" ]]; then problems+=("$platform $dest: COPYed by the Dockerfile, missing in the image"); continue; fi
    read -r perms owner _ <<<"$line"
    [[ "$owner" == "${chown/:/\/}" ]] || problems+=("$platform $dest: owner $owner, the Dockerfile says $chown")
    [[ "$perms" == "$(perms_of "$chmod")" ]] || problems+=("$platform $dest: mode $perms, the Dockerfile says $chmod")
    tar -xzf "$layer" -C "$dir" ".$dest"
    file -L "$dir$dest" | grep -Eq 'statically linked|static-pie linked' || problems+=("$platform $dest: not static: $(file -L "$dir$dest" | cut -d: -f2)")
    file -L "$dir$dest" | grep -q "$(file_arch "$arch")" || problems+=("$platform $dest: not $(file_arch "$arch"):$(file -L "$dir$dest" | cut -d: -f2)")
  done <<<"$copies"
  while read -r _ _ path; do
    [[ "$path" == /usr/local/bin/* && -z "${copied[$path]:-}" ]] && problems+=("$platform $path: in the image, not in the Dockerfile")
  done < "$dir.files"
  summary+=("$platform: $(printf '%s ' "${!copied[@]}")(static, $(file_arch "$arch"))")
}
summary=()
for platform in "${!manifest_of[@]}"; do check_platform "$platform" "${manifest_of[$platform]}"; done

if ((${#problems[@]})); then
  printf 'check-image: %s differs from %s:\n' "$image" "$dockerfile" >&2
  printf '  %s\n' "${problems[@]}" >&2
  exit 1
fi
log "check-image: ${image##*/} matches the Dockerfile: $(printf '%s; ' "${summary[@]}")USER $(sed -n 's/^USER //p' <<<"$stage" | tail -n 1), ENTRYPOINT $(sed -n 's/^ENTRYPOINT //p' <<<"$stage" | tail -n 1), CMD $(sed -n 's/^CMD //p' <<<"$stage" | tail -n 1)"
