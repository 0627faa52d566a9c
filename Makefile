# The two commands of the README, and a few more for developers.
SHELL := /bin/bash
PY := .venv/bin/python
ENGINE_PY := .venv-engine/bin/python
export DATABASE_URL_TEST ?= postgres://postgres@127.0.0.1:5432/infercap
export REDIS_URL_TEST ?= redis://127.0.0.1:6379/15

.PHONY: run test test-fast setup setup-run lock engine lint schema bench-quick clean

# Unset, manage.py and config.asgi use the production settings (fail closed); these targets are development.
# (make test does not: pytest takes config.settings.test from pyproject.toml.)
run schema bench-quick: export DJANGO_SETTINGS_MODULE ?= config.settings.local

## run: set up and start the whole platform on the embedded default (no PostgreSQL/Redis needed); installs only
## what running needs (requirements/run.txt)
run: setup-run
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py run_platform

## test: set up and run every test against real PostgreSQL and Redis (started if needed), browser tests and the
## real-vLLM tests (CPU build, installed once by the engine target) included; three pytest processes side by side
## (scripts/run_tests.sh)
test: setup engine
	scripts/ensure_services.sh
	scripts/ensure_prometheus.sh
	@if [ -x scripts/install_browser.sh ]; then scripts/install_browser.sh; fi
	scripts/run_tests.sh

## test-fast: the unit tests for the edit-run loop, in under 3 minutes: not tests/engine (real vLLM), nothing
## marked browser, e2e or slow, nor the three longest unit tests (FAST_SKIP); two pytest processes side by side, each
## with its own test database and Redis database (PostgreSQL and Redis must be running: scripts/ensure_services.sh)
FAST_FIRST := tests/api tests/billing tests/capacity tests/config tests/console
FAST_SKIP := tests/config/test_static_files.py::test_collected_files_are_served_compressed_with_cache_headers \
	tests/capacity/test_mix.py::test_bench_economics_figures_and_the_simulator_check \
	tests/test_container_image.py::test_collectstatic_finds_the_consoles_files
test-fast:
	@args=(-q -p no:cacheprovider -m "not browser and not e2e and not slow" $(FAST_SKIP:%=--deselect %)); \
	redis=$(REDIS_URL_TEST); redis2="$${redis%/*}/$$(( ($${redis##*/} + 15) % 16 ))"; log=$$(mktemp); \
	DATABASE_URL=$(DATABASE_URL_TEST)_fast REDIS_URL=$$redis2 INFERCAP_VAR_DIR=$$PWD/var/test-fast \
		$(PY) -m pytest "$${args[@]}" $(FAST_FIRST) >$$log 2>&1 & first=$$!; \
	DATABASE_URL=$(DATABASE_URL_TEST) REDIS_URL=$$redis $(PY) -m pytest "$${args[@]}" tests --ignore=tests/engine \
		$(FAST_FIRST:%=--ignore=%); rest=$$?; wait $$first; first_rc=$$?; \
	echo "==================== $(FAST_FIRST), run beside the rest ===================="; cat $$log; rm -f $$log; \
	test $$rest -eq 0 -a $$first_rc -eq 0

# Locked dependencies, hashes checked: the dev lock for tests, lint and CI; the run lock for make run and the image.
setup:
	@scripts/bootstrap.sh dev

setup-run:
	@scripts/bootstrap.sh run

## lock: after changing a dependency in pyproject.toml, regenerate requirements/run.txt and dev.txt (versions
## already locked are kept unless the change needs others) and commit them with pyproject.toml
lock:
	@test -x .venv/bin/uv || $(PY) -m pip install --quiet uv
	.venv/bin/uv pip compile pyproject.toml requirements/build.in --extra dev --generate-hashes --python-version 3.11 \
		--quiet --custom-compile-command "make lock" -o requirements/dev.txt
	.venv/bin/uv pip compile pyproject.toml requirements/build.in --generate-hashes --python-version 3.11 \
		--constraint requirements/dev.txt --quiet --custom-compile-command "make lock" -o requirements/run.txt

## engine: real vLLM for CPUs in .venv-engine (~150 s and 3.4 GB, once) and the tiny offline model (~8 s, once);
## INFERCAP_SKIP_ENGINE=1 skips both, and the engine tests then skip
engine:
	@scripts/install_engine.sh
	@if [ "$${INFERCAP_SKIP_ENGINE:-0}" != 1 ]; then $(ENGINE_PY) scripts/build_tiny_model.py; fi

## lint: ruff, the import contracts of pyproject.toml's [tool.importlinter] (apps, roles, lab, pure policies,
## independence), then the shape of the house read from the tree (tests/test_layers.py, tests/proxy/test_code_shape.py:
## no product import of the lab, app and file sizes, no import cycle, every module in a contract; no database needed)
lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/lint-imports --no-cache
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layers.py tests/proxy/test_code_shape.py

schema: setup
	DATABASE_URL=$(DATABASE_URL_TEST) $(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null

bench-quick: setup
	for b in sim planner routing autoscale proxy slo; do $(PY) manage.py bench $$b --quick | tail -n1; done

clean:
	rm -rf var artifacts .pytest_cache
