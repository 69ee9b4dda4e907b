#!/usr/bin/env bash
# Installs the Debian packages the test bed scripts use (run as root on Debian 12; idempotent).
# runc, the CNI plugins, iptables and conntrack are for the real node (e2e/testbed/node-up.sh).
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
if ((${#need[@]} == 0)); then
  echo "[testbed] install-deps: everything present (openssl, curl, ss, flock, setsid, git, runc, CNI plugins, iptables, conntrack, jq, socat, busybox-static, file, promtool)"
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
