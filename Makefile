# One-command set-up: every target creates the virtualenv and installs the package first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: service test test-fast check bytecode coverage conformance benchmark stress soak

# Set-up output goes to stderr: `make service` keeps stdout for protocol JSONL only.
# pip installs uv, which installs the package and its dependencies: the same versions
# pip resolves, in ~2 s instead of ~13 s (an upgraded pip) on a fresh clone. Unlike pip,
# uv writes no bytecode unless asked: without it, under PYTHONDONTWRITEBYTECODE=1 (CI),
# every daemon compiled httpx, httpcore, h11 and anyio again (~145 ms of CPU a start).
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) ..." >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(BIN)/pip install --quiet uv >&2
	@$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]' >&2
	@touch $(STAMP)

service: $(STAMP)
	@$(BIN)/magi-code --app service

check: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# Bytecode of the package and the tests, written once before a run: each service, shim
# and daemon a test starts then loads it instead of compiling every module it imports
# again (~0.75 s of CPU per daemon or embedded start). PYTHONDONTWRITEBYTECODE=1, as on
# CI's machine, stops Python writing it, not reading it. Up to date: a fraction of a second.
# Then the test modules' assertion-rewritten bytecode is pytest's own, written by one
# collection: without it every pytest worker rewrites every test module it collects
# (~4 s of CPU each); up to date, the collection costs ~3.5 s once. A collection error
# is left for the run that follows to report.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 src tests benchmarks
	@env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q --collect-only \
		-p no:cacheprovider tests >/dev/null 2>&1 || true

# Lint and types run beside the bytecode step: mypy keeps one core busy, the collection
# the other (~5 s off a fresh clone's run).
test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 check bytecode
	$(BIN)/python -m pytest -n 4 -q tests

# Line coverage of src/ over the whole suite, every Python process measured: pytest's
# workers and the services, shims and daemons they start, each of which imports
# tests/coverage_startup/sitecustomize.py from PYTHONPATH (docs/development.md). The
# tests that check what a process imports fail under measurement; the report still runs.
coverage: bytecode
	rm -f .coverage .coverage.*
	-PYTHONPATH=$(CURDIR)/tests/coverage_startup $(BIN)/python -m pytest -n 4 -q -p no:cacheprovider tests
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report

# The edit-test loop (under a minute): unit tests and the conformance scenarios through
# the daemon's in-memory transport; no lint, no process tests. CI runs `make test`.
test-fast: bytecode
	$(BIN)/python -m pytest -n 4 -q tests/unit tests/contract/test_fixtures_in_memory.py

# The gate a frontend's integration runs (under a minute, no network, no user stores): the
# credential-free contract scenarios against the installed magi-code in both modes, and
# the consumer fixtures through the reference validator; it ends with the fixture schema
# versions and the backend build it checked. A further check joins by adding its tests
# to CONFORMANCE.
CONFORMANCE := tests/contract/test_fixtures.py tests/unit/client/test_v1stream.py
conformance: bytecode
	MC_TEST_SERVICE_COMMAND=$(CURDIR)/$(BIN)/magi-code $(BIN)/python -m pytest -n 2 -q \
		-p no:cacheprovider -p tests.contract.conformance $(CONFORMANCE)

benchmark: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# The reliability suite at full counts (a few minutes); it prints its figures at the end.
# `make test` runs the same tests at short counts. MC_STRESS_SEED=N repeats a run's choices.
stress: bytecode
	MC_STRESS=full $(BIN)/python -m pytest -q -p no:cacheprovider tests/stress

# One daemon under a mixed load (shims, tool calls, an MCP server, cancels, disconnects,
# conversations that compact at their model's window), its health sampled every 30 s;
# stops after MINUTES or TURNS, whichever comes first.
MINUTES ?= 5
TURNS ?= 5000
soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --minutes $(MINUTES) --turns $(TURNS)
