# Entry points; every target runs from the repository root.
VENV := .venv
PY := $(VENV)/bin/python
RELAY := $(VENV)/bin/relay

.PHONY: setup run test lint lock bench down

setup:
	bash scripts/setup.sh

run: setup
	$(RELAY) stack up
	$(RELAY) run-demo

test: setup
	$(PY) -m pytest -q tests

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

lock:
	uv pip compile requirements.in -o requirements.txt --python-version 3.11

bench: setup
	$(RELAY) bench

down:
	$(RELAY) stack down
