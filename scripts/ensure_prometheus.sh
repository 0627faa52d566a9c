#!/usr/bin/env bash
# Make sure Prometheus and promtool (Debian's `prometheus` package) are installed for the rule and scrape tests;
# a no-op when promtool is on PATH. Without root or apt-get it says so and the tests that need them skip.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "cannot install prometheus (need root and apt-get); its tests will skip" >&2
  exit 0
fi
echo "==> installing prometheus (and promtool) from Debian packages"
DEBIAN_FRONTEND=noninteractive apt-get update -qq
# Only the binaries: the package's service is not started (policy-rc.d refuses), tests start their own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
