"""A CRITICAL relay_health run reaches a person through Airflow's own callback mechanism.

``dag.test()`` runs the real task runner: the task fails with HealthCriticalError, the runner calls the
task's ``on_failure_callback`` (RelayAlertNotifier), and the alert is POSTed to the endpoint of the
``relay_alerts`` connection, here an HTTP server on 127.0.0.1. No Spark or Kafka is needed: they are
configured on ports where nothing listens, which is itself CRITICAL. Needs Airflow's metadata DB
(``airflow db migrate``, about a minute), hence an integration test.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay.ledger.store import Ledger
from relay_dev.airflow_local import airflow_env, ensure_airflow_db

from tests.conftest import free_port
from tests.integration.helpers import RUNNER

pytestmark = pytest.mark.integration


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.put({"path": self.path, "body": json.loads(body)})  # type: ignore[attr-defined]
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def endpoint() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.received = queue.Queue()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture()
def data_dir() -> Iterator[Path]:
    base = PROJECT_ROOT / "var" / "pytest"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="alert-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_critical_health_run_posts_its_alert_through_on_failure_callback(endpoint, data_dir) -> None:
    config = load_config(
        {
            "RELAY_DATA_DIR": str(data_dir),
            "RELAY_PIPELINE": "orders",
            "RELAY_TOPIC": "orders",
            "RELAY_KAFKA_PORT": str(free_port()),
            "RELAY_SPARK_MASTER_PORT": str(free_port()),
            "RELAY_SPARK_MASTER_UI_PORT": str(free_port()),
            "RELAY_SPARK_REST_PORT": str(free_port()),
        }
    )
    Ledger(config.ledger_url, create=True).close()
    ensure_airflow_db(config)
    env = airflow_env(config)
    env["AIRFLOW_CONN_RELAY_ALERTS"] = f"http://127.0.0.1:{endpoint.server_address[1]}/alerts"
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(PROJECT_ROOT / "dags"), "relay_health", "{}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "DAG_RUN_STATE=failed" in result.stdout, output[-4000:]
    got = endpoint.received.get(timeout=5)  # POSTed before the task process ended
    body = got["body"]
    assert got["path"] == "/alerts", body
    assert (body["kind"], body["pipeline"], body["status"]) == ("health", "orders", "CRITICAL")
    assert (body["dag_id"], body["task_id"]) == ("relay_health", "check_health")
    assert "Spark master unreachable" in body["summary"] and "Kafka unreachable" in body["summary"]
    assert {c["name"] for c in body["checks"]} >= {"single_instance", "kafka"}
    assert endpoint.received.empty(), "one alert per failed run (no retry of a CRITICAL report)"
    assert "alert sent through connection 'relay_alerts'" in output, output[-4000:]
