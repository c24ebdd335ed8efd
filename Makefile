# handrail — the verbs people type. `make help` lists them.
.DEFAULT_GOAL := help
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install demo web test browser phoenix lint format typecheck bench crash clean

help: ## List the verbs
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install handrail with its dev tools

demo: $(STAMP) ## Run the offline support-desk demo (scripted model)
	$(BIN)/python -m handrail.demo

web: $(STAMP) ## Serve the support desk's web page (scripted model, SQLite); prints its URL
	$(BIN)/handrail serve handrail.demo.web:engine --port $(or $(PORT),8000)

browser: ## Install Debian's chromium for the browser tests, if missing and we can
	@command -v chromium >/dev/null \
	  || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	      && (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium </dev/null \
	          || (apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	              apt-get install -y -q chromium </dev/null))) \
	  || echo "!!! WARNING: chromium is missing and cannot be installed here (needs apt-get and root): THE BROWSER TESTS WILL BE SKIPPED. Install it with: apt-get install -y chromium"

test: $(STAMP) browser ## Run the whole test suite with branch coverage
	@if command -v npm >/dev/null; then npm ci --prefix js --no-audit --no-fund; else echo "!!! WARNING: npm is missing: MCP NODE TESTS SKIPPED (install Node.js 20+ and npm)"; fi
	$(BIN)/python -m pytest --cov --cov-report=term

phoenix: $(STAMP) ## Export spans to a real Arize Phoenix started here and check them (installs it once)
	PYTHON=$(PYTHON) tests/phoenix.sh

lint: $(STAMP) ## ruff format --check and ruff check
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(STAMP) ## Format and auto-fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP) ## mypy --strict on src/
	$(BIN)/mypy

bench: $(STAMP) ## Print the benchmark numbers (installs the bench extra)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench
	$(BIN)/python -m bench.stores
	$(BIN)/python -m bench.providers
	$(BIN)/python -m bench.suspend
	$(BIN)/python -m bench.durability
	$(BIN)/python -m bench.compaction
	$(BIN)/python -m bench.supervisor
	$(BIN)/python -m bench.capture
	$(BIN)/python -m bench.evals
	$(BIN)/python -m bench.server
	$(BIN)/python -m bench.replay
	$(BIN)/python -m bench.documents
	$(BIN)/python -m bench.age

crash: $(STAMP) ## Kill workers for real and check every effect (bench.crash)
	$(BIN)/python -m bench.crash

clean: ## Remove the venv and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .coverage
