#!/usr/bin/env bash
# Checks that an OCI image tarball (images.sh release) is the image the Dockerfile describes:
# the files its final stage COPYs (same paths, owner, mode; the binaries static), nothing else in
# /usr/local/bin, and the same USER, ENTRYPOINT and CMD. Exits 1 listing every difference.
#
# Usage: check-image.sh IMAGE.tar [DOCKERFILE]   (default: the repository's Dockerfile)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
image="${1:?usage: check-image.sh IMAGE.tar [DOCKERFILE]}"
dockerfile="${2:-$REPO_ROOT/Dockerfile}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$image"
blob() { printf '%s/blobs/sha256/%s' "$work" "${1#sha256:}"; }
manifest="$(blob "$(jq -r '.manifests[0].digest' "$work/index.json")")"
config="$(blob "$(jq -r '.config.digest' "$manifest")")"
layer="$(blob "$(jq -r '.layers[0].digest' "$manifest")")"

# The Dockerfile's final stage (after its last FROM), continuation lines joined.
stage="$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$dockerfile" | awk '/^FROM /{s=""} {s = s $0 "\n"} END{printf "%s", s}')"
problems=()
want_json() { # instruction config-key
  local want got
  want="$(sed -n "s/^$1 //p" <<<"$stage" | tail -n 1)"
  got="$(jq -c ".config.$2" "$config")"
  [[ "$(jq -c . <<<"$want" 2>/dev/null)" == "$got" ]] || problems+=("$1: Dockerfile $want, image $got")
}
want_json ENTRYPOINT Entrypoint
want_json CMD Cmd
user="$(sed -n 's/^USER //p' <<<"$stage" | tail -n 1)"
[[ "$(jq -r '.config.User' "$config")" == "$user" ]] || problems+=("USER: Dockerfile $user, image $(jq -r '.config.User' "$config")")

# "mode owner/group path" of every regular file in the layer.
tar -tzvf "$layer" --numeric-owner | awk '$1 ~ /^-/ {sub(/^\.\//, "/", $6); print $1, $2, $6}' > "$work/files"
declare -A copied=()
while read -r chown chmod dest; do
  copied[$dest]=1
  mode="$(printf '%s' "$chmod" | sed 's/^0*//')"
  line="$(awk -v p="$dest" '$3 == p' "$work/files")"
  if [[ -z "$line" ]]; then problems+=("$dest: COPYed by the Dockerfile, missing in the image"); continue; fi
  read -r perms owner _ <<<"$line"
  [[ "$owner" == "${chown/:/\/}" ]] || problems+=("$dest: owner $owner, the Dockerfile says $chown")
  [[ "$perms" == "$(printf -- '-%s' "$(for d in $(grep -o . <<<"$mode"); do
      printf '%s%s%s' "$( ((d & 4)) && echo r || echo -)" "$( ((d & 2)) && echo w || echo -)" "$( ((d & 1)) && echo x || echo -)"; done)")" ]] ||
    problems+=("$dest: mode $perms, the Dockerfile says $chmod")
  tar -xzf "$layer" -C "$work" ".$dest"
  file -L "$work$dest" | grep -Eq 'statically linked|static-pie linked' || problems+=("$dest: not static: $(file -L "$work$dest" | cut -d: -f2)")
done < <(sed -n 's/^COPY --from=[^ ]* --chown=\([^ ]*\) --chmod=\([^ ]*\) [^ ]* \([^ ]*\)$/\1 \2 \3/p' <<<"$stage")
((${#copied[@]} > 0)) || problems+=("no COPY --from=… --chown=… --chmod=… SRC DEST line in the Dockerfile's final stage")
while read -r _ _ path; do
  [[ "$path" == /usr/local/bin/* && -z "${copied[$path]:-}" ]] && problems+=("$path: in the image, not in the Dockerfile")
done < "$work/files"

if ((${#problems[@]})); then
  printf 'check-image: %s differs from %s:\n' "$image" "$dockerfile" >&2
  printf '  %s\n' "${problems[@]}" >&2
  exit 1
fi
log "check-image: ${image##*/} matches the Dockerfile: ${!copied[*]} (static), USER $user, ENTRYPOINT $(jq -c .config.Entrypoint "$config"), CMD $(jq -c .config.Cmd "$config")"
