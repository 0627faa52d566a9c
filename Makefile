# The two commands of the README, and a few more for developers.
SHELL := /bin/bash
PY := .venv/bin/python
ENGINE_PY := .venv-engine/bin/python
export DATABASE_URL_TEST ?= postgres://postgres@127.0.0.1:5432/infercap
export REDIS_URL_TEST ?= redis://127.0.0.1:6379/15

.PHONY: run test setup setup-run lock engine lint schema bench-quick clean

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

## lint: ruff, then the import contracts of pyproject.toml's [tool.importlinter] (layers, pure policies, independence)
lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/lint-imports --no-cache

schema: setup
	DATABASE_URL=$(DATABASE_URL_TEST) $(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null

bench-quick: setup
	for b in sim planner routing autoscale proxy slo; do $(PY) manage.py bench $$b --quick | tail -n1; done

clean:
	rm -rf var artifacts .pytest_cache
