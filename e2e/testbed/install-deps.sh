#!/usr/bin/env bash
# Installs the Debian packages the test bed scripts use (run as root on Debian 12; idempotent).
# runc, the CNI plugins, iptables and conntrack are for the real node (e2e/testbed/node-up.sh).
# Go itself is not installed here: the build needs Go >= 1.26 (see versions.env / README.md).
# --check: installs nothing; exits 1 naming what is missing. scripts/install-deps.sh runs this.
set -euo pipefail
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl ca-certificates)
command -v ss >/dev/null || need+=(iproute2)
command -v flock >/dev/null || need+=(util-linux)
command -v setsid >/dev/null || need+=(util-linux)
command -v sha256sum >/dev/null || need+=(coreutils)
command -v git >/dev/null || need+=(git)
# The real node (node-up.sh) and its images (images.sh).
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v modprobe >/dev/null || need+=(kmod)
command -v jq >/dev/null || need+=(jq)
command -v socat >/dev/null || need+=(socat) # the TLS front image of the data-plane suite
# dbop's release image (images.sh release, check-image.sh): busybox's static `cp`, as the Dockerfile.
[[ -x /bin/busybox ]] || need+=(busybox-static)
command -v file >/dev/null || need+=(file)
command -v promtool >/dev/null || need+=(prometheus) # promtool: e2e/tests/alerts.rs tests the chart's alerts
# make static builds for x86_64 and aarch64 (musl): Debian's musl wrappers of both architectures
# (musl-dev:arm64 pulls the aarch64 cross gcc); images.sh release takes busybox-static:arm64's
# `cp` for the arm64 image (apt-get download: needs the arm64 architecture); e2e/multiarch.sh runs
# the aarch64 binaries with qemu-aarch64-static (user-mode emulation, no binfmt needed).
command -v x86_64-linux-musl-gcc >/dev/null || need+=(musl-dev)
command -v aarch64-linux-musl-gcc >/dev/null || need+=(musl-dev:arm64)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
dpkg --print-foreign-architectures | grep -qx arm64 || add_arm64=1
if ((${#need[@]} == 0)) && [[ -z "${add_arm64:-}" ]]; then
  [[ "${1:-}" == --check ]] || echo "[testbed] install-deps: everything present (openssl, curl, ss, flock, setsid, git, runc, CNI plugins, iptables, conntrack, jq, socat, busybox-static, file, promtool, musl-dev amd64 and arm64, qemu-user-static)"
  exit 0
fi
if [[ "${1:-}" == --check ]]; then # (installs nothing; any user)
  echo "[testbed] install-deps: missing ${need[*]}${add_arm64:+ and the arm64 architecture}" >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "[testbed] install-deps: missing ${need[*]}${add_arm64:+ and the arm64 architecture}; run as root:${add_arm64:+ dpkg --add-architecture arm64 && apt-get update &&} apt-get install -y ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
[[ -z "${add_arm64:-}" ]] || dpkg --add-architecture arm64
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
echo "[testbed] install-deps: installed ${need[*]}"
