# Entry points; every target runs from the repository root.
VENV := .venv
PY := $(VENV)/bin/python
RELAY := $(VENV)/bin/relay

.PHONY: setup run test test-long test-hosts browser-check lint lock bench chaos down model provider

setup:
	bash scripts/setup.sh

run: setup
	$(RELAY) stack up
	$(RELAY) run-demo

# The suite (24 min on 2 fast cores from a fresh clone; 39-40 min on hosts half as fast): unit, DAG and integration tests on real parts, a short chaos run.
test: setup
	$(PY) -m pytest -q -m "not slow" --durations=20 tests

# Everything, with the PostgreSQL variants of the end-to-end scenarios and the slow side paths.
test-long: setup
	$(PY) -m pytest -q --durations=30 tests

# The multi-host cluster made of network namespaces (root; issue #14): a master, two workers, a broker, a
# PostgreSQL ledger and a client host, each with its own address and folders (the others' hidden); ~1.5 min.
# Then issue #14's acceptance: Relay deploys, upgrades, loses the driver's worker host and recovers on it
# (~9 min), and #18's: a hot standby placed on the other host takes over the active's host loss (~5 min). `make test` runs the smoke test only (skipped where namespaces can't be made).
test-hosts: setup
	$(PY) -m pytest -q -s -m multihost tests/integration/test_hosts_cluster.py tests/integration/test_hosts_deploy.py tests/integration/test_hosts_standby.py

# The browser check (headless Debian Chromium) on the stack `make run` started (RELAY_BROWSER_STACK=running:
# nothing started or stopped; fails when that stack or its pipeline is not up): upgrades the demo
# pipeline once through relay_upgrade (to the next vN) and runs relay_health, then checks the DAG list,
# relay_upgrade's Graph of that run and the Relay page's plots with the pipeline's data. Screenshot
# paths printed; RELAY_SCREENSHOT_DIR=docs/img saves the README's. 2.5-5 min on 2 cores. `make test-long` runs
# the same test on a private stack of its own (make run's steps on free ports under var/pytest/; 2-5 min).
browser-check: setup
	RELAY_BROWSER_STACK=running $(PY) -m pytest -q -s tests/integration/test_airflow_ui_browser.py

# Model-check the protocol (model/relay.pml) with spin: the model passes, every mutant fails.
model: setup
	bash model/check.sh

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The provider's wheel (relay + relay_airflow, no relay_dev) for an existing Airflow, into var/dist/
# (docs/deploy.md, "Install into your Airflow").
provider:
	bash scripts/build_provider.sh var/dist

lock:
	uv pip compile requirements.in -o requirements.txt --python-version 3.11

bench: setup
	$(RELAY) bench

# The full chaos run: 10 minutes of faults (22 of every kind, Airflow's scheduler and 65 s ledger locks
# included) on a private stack under var/chaos/, on the counter (examples/counter, Relay's default pipeline);
# CHAOS_ARGS adds options (e.g. --postgres, --seed 3, --pipeline-code examples/kafka_to_kafka: the shuffling
# Kafka example, counted from outside with confluent-kafka; examples/json_upsert: the upsert, by SQL).
chaos: setup
	$(RELAY) chaos --minutes 10 $(CHAOS_ARGS)

down:
	$(RELAY) stack down
