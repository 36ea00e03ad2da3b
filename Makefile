# The README's commands. `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
# What each command installs, from the lock files `make lock` writes (hashes required): the
# runtime alone for `make run`; the runtime and the test, lint and bench tools for the rest.
RUN_STAMP := $(VENV)/.run-$(shell cat requirements.lock pyproject.toml | sha1sum | cut -c1-12)
DEV_STAMP := $(VENV)/.dev-$(shell cat requirements-dev.lock pyproject.toml | sha1sum | cut -c1-12)
COMPILE   := $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
             --no-emit-index-url --no-emit-find-links

.PHONY: run test check image-test lint bench install lock lock-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): requirements.lock pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.run-* && touch $@

$(DEV_STAMP): requirements-dev.lock pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.dev-* $(VENV)/.run-* && touch $@ $(RUN_STAMP)

install: $(DEV_STAMP)

run: $(RUN_STAMP)
	$(BIN)/billing-outbox db upgrade
	@HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m webapp.first_run
	$(BIN)/billing-outbox serve --host $(HOST) --port $(PORT)

# Both lock files from pyproject.toml; the tools' lock keeps the runtime's pins. The runtime's
# also pins what builds the package's wheel (setuptools, wheel), for the image. An existing
# pin stays until `make lock UPGRADE=1` (pip-compile --upgrade).
lock: $(DEV_STAMP)
	$(COMPILE) $(if $(UPGRADE),--upgrade) --build-deps-for wheel -o requirements.lock pyproject.toml
	$(COMPILE) $(if $(UPGRADE),--upgrade) --extra dev --extra bench -c requirements.lock \
	    -o requirements-dev.lock pyproject.toml

# CI: the lock files are what `make lock` writes from pyproject.toml today.
lock-check: $(DEV_STAMP)
	@tmp=$$(mktemp -d) && cp requirements.lock requirements-dev.lock $$tmp/ \
	 && $(COMPILE) --build-deps-for wheel -o $$tmp/requirements.lock pyproject.toml \
	 && $(COMPILE) --extra dev --extra bench -c $$tmp/requirements.lock \
	      -o $$tmp/requirements-dev.lock pyproject.toml \
	 && sed -i "s#$$tmp/##g" $$tmp/requirements.lock $$tmp/requirements-dev.lock \
	 && diff -u requirements.lock $$tmp/requirements.lock \
	 && diff -u requirements-dev.lock $$tmp/requirements-dev.lock \
	 && echo "lock files are current" ; rc=$$?; rm -rf $$tmp; exit $$rc

# Two processes, each taking whole test files (module fixtures such as the browser's served
# stack stay in one process); PostgreSQL tests each have a schema of their own.
TEST_WORKERS ?= 2

# COVERAGE=1 (as CI runs it): branch coverage of webapp/, each line's tests recorded, the
# report in the terminal and test-artifacts/coverage/; below COVERAGE_FLOOR percent fails.
COVERAGE_FLOOR ?= 0
COV_ARGS = $(if $(COVERAGE),--cov --cov-context=test --cov-report=term:skip-covered \
	    --cov-report=html --cov-fail-under=$(COVERAGE_FLOOR))

test: $(DEV_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile \
	    --ignore=tests/image $(COV_ARGS) $(PYTEST_ARGS)

# The loop while working: SQLite only, no process, browser or slow test (markers derived at
# collection, tests/conftest.py), the tests that failed last time first. `make test` runs all.
check: $(DEV_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --ff --ignore=tests/image \
	    -m "not postgres and not process and not browser and not slow" $(PYTEST_ARGS)

# The container image built with podman on a debootstrapped Debian base, then run (needs root,
# podman, runc and debootstrap; .ci/run installs them and calls this after `make test`).
image-test: $(DEV_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/image $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check webapp tests bench
	$(BIN)/mypy --strict webapp
	$(BIN)/lint-imports

bench: $(DEV_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info test-artifacts
