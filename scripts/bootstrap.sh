#!/usr/bin/env bash
# Create .venv and install infercap from the locked dependencies (requirements/*.txt, hashes checked), then
# infercap itself without its dependencies. `scripts/bootstrap.sh run` installs only what running needs (make
# run, the container image); `scripts/bootstrap.sh dev` (the default: make test, make lint, CI) adds the test,
# lint and browser tooling. A no-op when the lock and pyproject.toml are unchanged since the last install.
# Changed a dependency in pyproject.toml? Run `make lock` and commit requirements/*.txt with it.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-dev}
case "$kind" in run | dev) ;; *) echo "usage: $0 [run|dev]" >&2; exit 2 ;; esac
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
lock=requirements/$kind.txt
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.infercap-installed
want_for() { cat "requirements/$1.txt" pyproject.toml | sha256sum | cut -d' ' -f1; }
have=$(cat "$stamp" 2>/dev/null || true)
# The dev lock holds everything the run lock does, at the same versions (make lock constrains one by the other).
if [ "$have" = "run $(want_for run)" ] && [ "$kind" = run ] || [ "$have" = "dev $(want_for dev)" ]; then
  exit 0
fi
echo "==> installing the $kind dependencies ($lock, hashes checked)"
# make run starts sooner without compiling every installed module up front (Python compiles what it imports).
compile=$([ "$kind" = run ] && echo --no-compile || true)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps $compile -r "$lock"
# The build backend comes from the lock too, so the editable install needs no download.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
echo "$kind $(want_for "$kind")" > "$stamp"
