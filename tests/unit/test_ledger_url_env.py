"""``RELAY_LEDGER_URL`` (a PostgreSQL URL here) reaches Airflow and the tasks it runs, as the README says.

``relay stack up`` and ``relay airflow up`` build their configuration with ``load_config()`` from the
environment and start Airflow with ``airflow_env(config)``; a task rebuilds its configuration with
``relay_config_from_connections()``. The chain is followed without starting anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay_dev.airflow_local import airflow_env

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
_HOME = load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
for _key, _value in airflow_env(_HOME).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)

URL = "postgresql+psycopg2://relay:s3cret@db.example:5433/relay"


def test_the_ledger_url_reaches_airflow_and_its_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_LEDGER_URL": URL})  # as `relay ... up` does
    assert config.ledger_url == URL
    env = airflow_env(config)
    assert env["RELAY_LEDGER_URL"] == URL
    assert json.loads(env["AIRFLOW_CONN_RELAY_LEDGER"])["extra"]["url"] == URL

    for key, value in env.items():  # what an Airflow process started with that environment sees
        if key.startswith(("RELAY_", "AIRFLOW_CONN_")):
            monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    from relay_airflow.config import relay_config_from_connections

    assert relay_config_from_connections().ledger_url == URL
