#!/usr/bin/env bash
# Installs the Debian packages the test bed scripts use (run as root on Debian 12; idempotent).
# Go itself is not installed here: the build needs Go >= 1.26 (see versions.env / README.md).
set -euo pipefail
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl ca-certificates)
command -v ss >/dev/null || need+=(iproute2)
command -v flock >/dev/null || need+=(util-linux)
command -v setsid >/dev/null || need+=(util-linux)
command -v sha256sum >/dev/null || need+=(coreutils)
command -v git >/dev/null || need+=(git)
if ((${#need[@]} == 0)); then
  echo "[testbed] install-deps: everything present (openssl, curl, ss, flock, setsid)"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "[testbed] install-deps: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
echo "[testbed] install-deps: installed ${need[*]}"
