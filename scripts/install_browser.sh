#!/usr/bin/env bash
# Browser tests' needs: Debian's Chromium and the Playwright Python package (its bundled driver only; we never run
# `playwright install`, which would download a browser build). Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  echo "install_browser: installing Debian's chromium" >&2
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

if ! "$PY" -c "import playwright" >/dev/null 2>&1; then
  echo "install_browser: installing the playwright package" >&2
  "$PY" -m pip install -q "playwright>=1.45"
fi
