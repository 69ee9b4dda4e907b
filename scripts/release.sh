#!/usr/bin/env bash
# `make release`: the release's artifacts under target/release-artifacts/ (DBOP_RELEASE_DIR), built
# without Docker, and — only with PUSH=1 — published to the registry path of release.env:
#
#   dbop-<version>.oci.tar   the operator's image, an OCI image-layout archive of one index for
#                            linux/amd64 and linux/arm64 (e2e/testbed/images.sh release, from the
#                            static binaries `make static` built; checked against the Dockerfile)
#   dbop-<version>.tgz       the chart (helm package), its image.repository the image's path
#   SHA256SUMS
#
# The Makefile runs `make static` first. Root is needed (images.sh writes root-owned files into
# the image). helm is the test bed's (e2e/testbed/build.sh tools builds it) or $DBOP_HELM.
# IMAGE_REPOSITORY / CHART_REPOSITORY override release.env's DBOP_IMAGE_REPOSITORY /
# DBOP_CHART_REPOSITORY (a fork's registry). With PUSH=1: `helm push` for the chart, and the image
# with skopeo, crane or oras, whichever is on PATH; with none of them it stops and prints the
# command to run, having pushed nothing. Log in first (`helm registry login <registry>`, and the
# image tool's own login).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=../release.env
. ./release.env
# shellcheck source=../e2e/testbed/lib.sh
. e2e/testbed/lib.sh
image_repo=${IMAGE_REPOSITORY:-$DBOP_IMAGE_REPOSITORY}
chart_repo=${CHART_REPOSITORY:-$DBOP_CHART_REPOSITORY}
push=${PUSH:-0}
out=${DBOP_RELEASE_DIR:-$root/target/release-artifacts}
say() { printf '[release] %s\n' "$*" >&2; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[[ -n "$version" ]] || die "no version in Cargo.toml"
[[ "$chart_repo" == oci://* ]] || die "the chart repository must be oci://… (got $chart_repo)"

helm=${DBOP_HELM:-$(testbed_tools_bin_dir)/helm}
[[ -x "$helm" ]] || die "no helm at $helm: build it with e2e/testbed/build.sh tools (or set DBOP_HELM)"

mkdir -p "$out"
say "the image $image_repo:$version (linux/amd64 + linux/arm64, no Docker)"
read -r _ tarball < <(e2e/testbed/images.sh release | tail -n 1)
[[ -f "${tarball:-}" ]] || die "images.sh release printed no tarball"
cp -f "$tarball" "$out/dbop-$version.oci.tar"

say "the chart $chart_repo/dbop:$version (image.repository $image_repo)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r charts/dbop "$work/dbop"
# The chart names release.env's path already; a fork's IMAGE_REPOSITORY goes into its copy.
sed -i "s#^  repository: .*#  repository: $image_repo#" "$work/dbop/values.yaml"
rm -f "$out"/dbop-*.tgz
"$helm" package "$work/dbop" --version "$version" --app-version "$version" -d "$out" >/dev/null
chart_tgz=$out/dbop-$version.tgz
[[ -f "$chart_tgz" ]] || die "helm package wrote no $chart_tgz"
rendered=$("$helm" template dbop "$chart_tgz" -n dbop-system | sed -n 's/^ *image: "\(.*\)"$/\1/p' | sort -u)
[[ "$rendered" == "$image_repo:$version" ]] ||
  die "the packaged chart installs the image '$rendered', not $image_repo:$version"

(cd "$out" && sha256sum "dbop-$version.oci.tar" "dbop-$version.tgz" >SHA256SUMS)
say "artifacts in $out:"
(cd "$out" && ls -l "dbop-$version.oci.tar" "dbop-$version.tgz" SHA256SUMS) >&2

# The commands that publish them, run only with PUSH=1.
image_push_commands() {
  cat <<CMDS
  skopeo copy --all oci-archive:$out/dbop-$version.oci.tar:$version docker://$image_repo:$version
  # or: mkdir layout && tar -C layout -xf $out/dbop-$version.oci.tar && crane push --index layout $image_repo:$version
  # or: oras cp -r --from-oci-layout layout:$version $image_repo:$version
  $helm push $chart_tgz $chart_repo
CMDS
}
if [[ "$push" != 1 ]]; then
  say "not pushed (PUSH=1 pushes them); the commands:"
  image_push_commands >&2
  exit 0
fi

say "pushing the image to $image_repo:$version"
if command -v skopeo >/dev/null; then
  skopeo copy --all "oci-archive:$out/dbop-$version.oci.tar:$version" "docker://$image_repo:$version"
elif command -v crane >/dev/null || command -v oras >/dev/null; then
  mkdir -p "$work/layout"
  tar -C "$work/layout" -xf "$out/dbop-$version.oci.tar"
  if command -v crane >/dev/null; then crane push --index "$work/layout" "$image_repo:$version"
  else oras cp -r --from-oci-layout "$work/layout:$version" "$image_repo:$version"; fi
else
  say "no skopeo, crane or oras on PATH: nothing was pushed. Install one of them and run:"
  image_push_commands >&2
  exit 1
fi
say "pushing the chart to $chart_repo"
"$helm" push "$chart_tgz" "$chart_repo"
say "published: $image_repo:$version and $chart_repo/dbop $version"
