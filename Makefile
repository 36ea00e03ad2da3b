# The README's commands. `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test lint bench install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/billing-outbox db upgrade
	@HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m webapp.first_run
	$(BIN)/billing-outbox serve --host $(HOST) --port $(PORT)

# Two processes, each taking whole test files (module fixtures such as the browser's served
# stack stay in one process); PostgreSQL tests each have a schema of their own.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check webapp tests bench
	$(BIN)/mypy --strict webapp
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info test-artifacts
