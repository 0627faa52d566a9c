#!/usr/bin/env bash
# The test run of `make test`: the real-engine tests (tests/engine/, ~10 minutes, most of it vLLM start-ups that
# import torch in three processes) run in a second pytest process beside the rest of the suite, each with its own
# test database, Redis database and var directory; both must pass. The engine tests run at a lower CPU priority
# (nice 10): on two cores the rest of the suite, whose end-to-end tests keep time, gets the CPU when both want it,
# and the engines take what it leaves. Arguments: one pytest run of just those.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
db=${DATABASE_URL_TEST:-postgres://postgres@127.0.0.1:5432/infercap}
redis=${REDIS_URL_TEST:-redis://127.0.0.1:6379/15}
pytest=("$PY" -m pytest -q -p no:cacheprovider)

if [ $# -gt 0 ]; then
  DATABASE_URL=$db REDIS_URL=$redis exec "${pytest[@]}" "$@"
fi

case "$db" in *\?*) echo "DATABASE_URL_TEST must not carry a query string" >&2; exit 2 ;; esac
if [[ $redis =~ ^(.*)/([0-9]+)$ ]]; then  # the next Redis database down
  engine_redis="${BASH_REMATCH[1]}/$(( (BASH_REMATCH[2] + 15) % 16 ))"
else
  engine_redis="${redis%/}/14"
fi
engine_log=$(mktemp -t infercap-engine-tests.XXXXXX)
DATABASE_URL="${db}_engine" REDIS_URL=$engine_redis INFERCAP_VAR_DIR="$PWD/var/test-engine" \
  INFERCAP_VLLM_MODELS_DIR="$PWD/var/engine" nice -n 10 "${pytest[@]}" --durations=15 tests/engine >"$engine_log" 2>&1 &
engine_pid=$!
trap 'kill -- "$engine_pid" 2>/dev/null' EXIT INT TERM
echo "tests/engine runs beside the rest (its output follows at the end; $engine_log)"

DATABASE_URL=$db REDIS_URL=$redis "${pytest[@]}" --durations=25 --ignore=tests/engine
rest=$?
wait "$engine_pid"
engine=$?
trap - EXIT INT TERM
echo
echo "==================== tests/engine (real vLLM), run beside the rest ===================="
cat "$engine_log"
rm -f "$engine_log"
if [ "$rest" -ne 0 ] || [ "$engine" -ne 0 ]; then
  echo "make test: FAILED (rest of the suite: exit $rest; tests/engine: exit $engine)" >&2
  exit 1
fi
