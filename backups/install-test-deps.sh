#!/usr/bin/env bash
# Installs what dbop-backup's tests and benchmark need, on a fresh Debian 12, as root.
# Idempotent: each step runs only when its tool is missing.
#   - PostgreSQL server and client (Debian's packages; tests run initdb as the `postgres` user)
#   - rclone, zstd, GNU time (the benchmark's baseline pipeline and measurements), openssl (TLS test)
#   - libnss-wrapper (`recover` as a uid /etc/passwd does not list, as the Debian images have it)
#   - s3s-fs 0.14.1 (cargo), moto_server (PyPI, in a venv under /opt/dbop-test)
#
# --check: installs nothing; exits 1 naming what is missing (any user).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
export PATH="$HOME/.cargo/bin:$PATH"

packages=(postgresql postgresql-client rclone zstd time openssl ca-certificates python3 python3-venv libnss-wrapper)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
absent=("${missing[@]}")
command -v s3s-fs >/dev/null 2>&1 || absent+=(s3s-fs)
command -v moto_server >/dev/null 2>&1 || absent+=(moto_server)
if [[ "${1:-}" == --check ]]; then
  ((${#absent[@]} == 0)) || { echo "install-test-deps.sh: missing ${absent[*]}" >&2; exit 1; }
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  ((${#absent[@]} == 0)) && exit 0
  echo "install-test-deps.sh: missing ${absent[*]}; run as root" >&2
  exit 1
fi
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian starts a default cluster on 5432; the tests start their own servers on free ports.

if ! command -v s3s-fs >/dev/null 2>&1; then
  echo "installing s3s-fs 0.14.1"
  cargo install s3s-fs --version 0.14.1 --features binary --locked
fi

if ! command -v moto_server >/dev/null 2>&1; then
  echo "installing moto[server] into /opt/dbop-test/moto"
  python3 -m venv /opt/dbop-test/moto
  /opt/dbop-test/moto/bin/pip install -q 'moto[server]>=5,<6'
  ln -sf /opt/dbop-test/moto/bin/moto_server /usr/local/bin/moto_server
fi

echo "dbop-backup test dependencies:"
ls /usr/lib/postgresql/*/bin/initdb
command -v rclone s3s-fs moto_server
