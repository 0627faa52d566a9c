#!/usr/bin/env bash
# The test run of `make test`: three pytest processes side by side, each with its own test database, Redis
# database and var directory; all three must pass.
#   engine  tests/engine/ (~10 minutes, most of it vLLM start-ups that import torch in three processes), then the
#           two benches that are pure CPU in this process (AFTER_ENGINE), at a lower CPU priority (nice 10): on two
#           cores the other two, whose end-to-end tests keep time, get the CPU when both want it;
#   serve   the request path's tests (tests/proxy, billing, benchmarks, reliability, console);
#   rest    everything else, the autoscaler's tests included.
# The two cores are busy through most of the run (2,314 CPU-seconds over a 21-minute run on 2026-12-07, when the
# routing and autoscaling benches ran in the serve process, which then ended 5 minutes after the others with a
# core to spare): the split keeps the three ending near each other. Output: the rest live, then the other two.
# Arguments: one pytest run of just those.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
db=${DATABASE_URL_TEST:-postgres://postgres@127.0.0.1:5432/infercap}
redis=${REDIS_URL_TEST:-redis://127.0.0.1:6379/15}
pytest=("$PY" -m pytest -q -p no:cacheprovider)
SERVE=(tests/proxy tests/billing tests/benchmarks tests/reliability tests/console)
# Simulated days and routing stages in this process, no clock to keep: they run in the engine's process once its
# engines are gone.
AFTER_ENGINE=(tests/benchmarks/test_autoscale.py tests/benchmarks/test_routing.py)

if [ $# -gt 0 ]; then
  DATABASE_URL=$db REDIS_URL=$redis exec "${pytest[@]}" "$@"
fi

case "$db" in *\?*) echo "DATABASE_URL_TEST must not carry a query string" >&2; exit 2 ;; esac
# The next Redis databases down from the one given, for the other two runs.
if [[ $redis =~ ^(.*)/([0-9]+)$ ]]; then
  redis_base=${BASH_REMATCH[1]} redis_db=${BASH_REMATCH[2]}
else
  redis_base=${redis%/} redis_db=15
fi
redis_for() { echo "$redis_base/$(( (redis_db + 16 - $1) % 16 ))"; }

logs=$(mktemp -d -t infercap-tests.XXXXXX)
pids=()
trap 'kill -- "${pids[@]}" 2>/dev/null' EXIT INT TERM
DATABASE_URL="${db}_engine" REDIS_URL=$(redis_for 1) INFERCAP_VAR_DIR="$PWD/var/test-engine" \
  INFERCAP_VLLM_MODELS_DIR="$PWD/var/engine" nice -n 10 "${pytest[@]}" --durations=15 tests/engine "${AFTER_ENGINE[@]}" \
  >"$logs/engine" 2>&1 &
pids+=($!)
DATABASE_URL="${db}_serve" REDIS_URL=$(redis_for 2) INFERCAP_VAR_DIR="$PWD/var/test-serve" \
  "${pytest[@]}" --durations=20 "${SERVE[@]}" "${AFTER_ENGINE[@]/#/--ignore=}" >"$logs/serve" 2>&1 &
pids+=($!)
echo "tests/engine (then ${AFTER_ENGINE[*]}) and ${SERVE[*]} run beside the rest; their output follows at the end"

ignores=(--ignore=tests/engine)
for path in "${SERVE[@]}"; do ignores+=("--ignore=$path"); done
DATABASE_URL=$db REDIS_URL=$redis "${pytest[@]}" --durations=20 "${ignores[@]}"
rest=$?
wait "${pids[0]}"
engine=$?
wait "${pids[1]}"
serve=$?
trap - EXIT INT TERM
echo
echo "==================== ${SERVE[*]}, run beside the rest ===================="
cat "$logs/serve"
echo
echo "==================== tests/engine (real vLLM) and ${AFTER_ENGINE[*]}, run beside the rest ===================="
cat "$logs/engine"
rm -rf "$logs"
if [ "$rest" -ne 0 ] || [ "$serve" -ne 0 ] || [ "$engine" -ne 0 ]; then
  echo "make test: FAILED (rest: exit $rest; ${SERVE[*]}: exit $serve; tests/engine ${AFTER_ENGINE[*]}: exit $engine)" >&2
  exit 1
fi
