# gpuwatch: make install | make test | make demo | make lint
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install os-deps venv test lint unit stack-up stack-down demo schemas clean

install: os-deps venv

os-deps:
	@scripts/os-deps.sh

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

lint: venv
	$(BIN)/ruff check gpuwatch schemas producers streams sinks tests
	$(BIN)/ruff format --check gpuwatch schemas producers streams sinks tests
	$(BIN)/mypy
	$(BIN)/lint-imports

schemas: venv
	$(BIN)/python -m schemas.export

stack-up: install
	$(BIN)/gpuwatch stack up

stack-down:
	$(BIN)/gpuwatch stack down

# The main job on one machine. Today: the local stack and the topics.
demo: install
	$(BIN)/gpuwatch stack up
	$(BIN)/gpuwatch topics create
	@echo "Kafka 127.0.0.1:9092, Redis 127.0.0.1:6379, Prometheus http://127.0.0.1:9090"
	@echo "stop with: $(BIN)/gpuwatch stack down"

unit: venv
	$(BIN)/pytest -q tests/unit

# The whole suite: lint and types, then unit, integration and e2e tests against
# the real local stack (started here when it is not running).
test: install lint stack-up
	$(BIN)/pytest -q tests

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
