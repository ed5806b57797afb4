# One-command set-up: every target creates the virtualenv and installs the package first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: service test check benchmark

# Set-up output goes to stderr: `make service` keeps stdout for protocol JSONL only.
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) ..." >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(BIN)/pip install --quiet --upgrade pip >&2
	@$(BIN)/pip install --quiet -e '.[dev]' >&2
	@touch $(STAMP)

service: $(STAMP)
	@$(BIN)/magi-code --app service

check: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

test: check
	$(BIN)/python -m pytest -n 2 -q tests

benchmark: $(STAMP)
	$(BIN)/python benchmarks/run_all.py
