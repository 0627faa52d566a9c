#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432, trust auth) and Redis (127.0.0.1:6379) are up for the tests.
# Starts them when installed but stopped; installs them from Debian's packages when absent and we are root.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

install_pkgs() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "cannot install $* (need root and apt-get); start them yourself" >&2
    exit 1
  fi
  echo "==> installing $* from Debian packages"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v pg_isready >/dev/null || ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  install_pkgs postgresql
fi
if ! pg_up; then
  echo "==> starting PostgreSQL"
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  conf=/etc/postgresql/$ver/main/pg_hba.conf
  # Tests connect as postgres over TCP without a password (trust on loopback only).
  if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$conf"; then
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$conf"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start
fi
for _ in $(seq 1 30); do pg_up && break; sleep 1; done
pg_up || { echo "PostgreSQL did not come up" >&2; exit 1; }

if ! command -v redis-server >/dev/null; then
  install_pkgs redis-server
fi
if ! redis_up; then
  echo "==> starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
for _ in $(seq 1 30); do redis_up && break; sleep 1; done
redis_up || { echo "Redis did not come up" >&2; exit 1; }
echo "==> PostgreSQL and Redis are up"
