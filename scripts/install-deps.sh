#!/usr/bin/env bash
# The one installer: everything `make run` and `make test` need on a fresh Debian 12 machine with
# Rust (rustup) and Go >= 1.26 (neither is installed here; see README.md). Idempotent; as root.
# `.ci/run` runs it stage by stage; `make deps` runs it whole; `make run` and `make test` run it
# with --if-missing first.
#
#   scripts/install-deps.sh [--check | --if-missing] [system] [rust] [testbed] [backups]
#
#   system    Debian's build tools and what the scripts call (build-essential, pkg-config, curl,
#             git, openssl, iproute2, util-linux, procps, musl-tools, jq, bsdextrautils' `column`)
#   rust      rustfmt and clippy, the musl targets x86_64 and aarch64 (make static)
#   testbed   e2e/testbed/install-deps.sh: the test bed's tools, the real node's runc, CNI plugins,
#             iptables, conntrack; promtool, busybox-static, musl-dev amd64+arm64, qemu-user-static
#   backups   backups/install-test-deps.sh: PostgreSQL, rclone, zstd, libnss-wrapper, s3s-fs, moto_server
#   (none: all four)
#
#   --check       install nothing: exit 1 naming what is missing (any user; quick: no apt, no network)
#   --if-missing  check first; install only the groups where something is missing, as root — when
#                 not root, stop and print the exact command to run with sudo (rustup's components
#                 and targets excepted: those are added as the user, whose toolchain they belong to)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin" # (iptables, modprobe: /usr/sbin, not on a user's PATH)

mode=install
case "${1:-}" in --check | --if-missing) mode=${1#--}; shift ;; esac
groups=("$@")
((${#groups[@]})) || groups=(system rust testbed backups)

system_packages=(build-essential pkg-config ca-certificates curl git openssl iproute2 util-linux procps musl-tools jq bsdextrautils)
rust_targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
rust_components=(rustfmt clippy)

missing_system() {
  local installed p
  installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${system_packages[@]}" 2>/dev/null | awk '$NF == "installed" { print $1 }' || true)
  for p in "${system_packages[@]}"; do grep -qx "$p" <<<"$installed" || echo "$p"; done
}
missing_rust() {
  if ! command -v cargo >/dev/null; then echo cargo; return; fi
  command -v rustup >/dev/null || return 0 # Debian's cargo: no components or targets to add
  local installed t c
  installed=$(rustup target list --installed 2>/dev/null)
  for t in "${rust_targets[@]}"; do grep -qx "$t" <<<"$installed" || echo "rustup-target:$t"; done
  installed=$(rustup component list --installed 2>/dev/null)
  for c in "${rust_components[@]}"; do grep -q "^$c" <<<"$installed" || echo "rustup-component:$c"; done
}
missing() { # group -> what is missing, one per line
  case "$1" in
    system) missing_system ;;
    rust) missing_rust ;;
    testbed) e2e/testbed/install-deps.sh --check 2>&1 | sed -n 's/.*missing //p' ;;
    backups) backups/install-test-deps.sh --check 2>&1 | sed -n 's/.*missing //p' ;;
    *) echo "install-deps.sh: unknown group $1 (system, rust, testbed, backups)" >&2; exit 2 ;;
  esac
}

install_system() {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${system_packages[@]}"
}
install_rust() {
  if ! command -v cargo >/dev/null; then
    echo "no cargo on this machine: installing Debian's cargo and rustc (rustup's is preferred: dbop needs Rust >= 1.89)"
    apt-get install -y -qq --no-install-recommends cargo rustc
  fi
  if command -v rustup >/dev/null; then
    rustup component add "${rust_components[@]}" >/dev/null 2>&1 || rustup component add "${rust_components[@]}"
    # Static binaries (make static; the real node's dbop image takes a static dbop-instance), for
    # x86_64 and aarch64 (the multi-arch release image; the testbed group adds the C cross tools).
    rustup target add "${rust_targets[@]}"
  fi
  cargo --version
  if command -v go >/dev/null; then go version; else echo "no go on PATH: the test bed needs Go >= 1.26 (not installed here)"; fi
}
install_group() {
  case "$1" in
    system) install_system ;;
    rust) install_rust ;;
    testbed) e2e/testbed/install-deps.sh ;;
    backups) backups/install-test-deps.sh ;;
  esac
}

if [[ $mode != install ]] && ! command -v dpkg-query >/dev/null; then
  # (not Debian: nothing to check against; the scripts still name each tool they miss)
  echo "install-deps.sh: not a Debian system (no dpkg-query): nothing checked or installed" >&2
  exit 0
fi
if [[ $mode != install ]]; then
  absent=() need_root=()
  for g in "${groups[@]}"; do
    found=()
    while read -r m; do [[ -z "$m" ]] || found+=("$m"); done < <(missing "$g")
    ((${#found[@]})) || continue
    absent+=("${found[@]}")
    # rustup's components and targets are the user's own: added as this user, never with sudo
    # (root's rustup, if any, is another toolchain).
    if [[ $g == rust && $mode == if-missing && $(id -u) -ne 0 ]]; then
      if command -v rustup >/dev/null; then install_rust; continue; fi
      echo "no cargo: install Rust >= 1.89 with rustup (https://rustup.rs), as this user" >&2
      exit 1
    fi
    need_root+=("$g")
  done
  ((${#absent[@]})) || exit 0
  echo "missing: ${absent[*]}" >&2
  [[ $mode == check ]] && exit 1
  ((${#need_root[@]})) || exit 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "these are installed as root; run:  sudo $PWD/scripts/install-deps.sh ${need_root[*]}" >&2
    exit 1
  fi
  echo "installing them (scripts/install-deps.sh ${need_root[*]})" >&2
  groups=("${need_root[@]}")
fi
for g in "${groups[@]}"; do install_group "$g"; done
