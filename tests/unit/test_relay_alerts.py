"""RelayAlertNotifier against a real HTTP server on 127.0.0.1, and its log fallback.

The connection comes as an AIRFLOW_CONN_* variable, exactly as Airflow resolves it in a task; the
server records each POST in a queue before it answers, so a returned notify() means it was received.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from relay.config import PROJECT_ROOT, load_config
from relay.errors import OperationError
from relay.health import Check, HealthReport, Level
from relay_dev.airflow_local import airflow_env

# Airflow reads AIRFLOW_HOME when first imported: point it under var/ (not ~/airflow) before that.
for _key, _value in airflow_env(
    load_config({"RELAY_DATA_DIR": str(PROJECT_ROOT / "var" / "pytest" / "airflow-parse")})
).items():
    if _key.startswith("AIRFLOW"):
        os.environ.setdefault(_key, _value)
if str(PROJECT_ROOT / "plugins") not in sys.path:  # Airflow puts plugins/ on sys.path; tests do it here
    sys.path.insert(0, str(PROJECT_ROOT / "plugins"))

from relay_airflow.hooks.alerts import RelayAlertsHook  # noqa: E402
from relay_airflow.notifiers import HealthCriticalError, RelayAlertNotifier  # noqa: E402


class Recorder(BaseHTTPRequestHandler):
    """Puts every POST (path, headers, JSON body) in the server's queue, then answers its status."""

    server: Endpoint

    def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.put({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # keep pytest's output clean
        pass


class Endpoint(ThreadingHTTPServer):
    received: queue.Queue[dict[str, Any]]
    status: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture()
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint(("127.0.0.1", 0), Recorder)  # port 0: the OS picks a free one
    server.received, server.status = queue.Queue(), 204
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def critical_report() -> dict[str, Any]:
    checks = [
        Check("single_instance", Level.OK, "RUNNING: instance 3 ACTIVE (v1, blue)"),
        Check(
            "progress",
            Level.CRITICAL,
            "STALL on partition(s) [1]: the job runs and records are waiting, but the cursor has not "
            "moved ([1] for 6.7 min)",
            action="read the driver log; if it hangs, run the DAG relay_stop (or `relay stop`)",
        ),
    ]
    report = HealthReport("orders", time.time(), Level.CRITICAL, checks, report_id=42)
    return report.to_json()


def failure_context(exc: BaseException, dag_id: str = "relay_health", task_id: str = "check_health") -> dict:
    """What the task runner hands to on_failure_callback, reduced to what the notifier reads."""
    ti = SimpleNamespace(
        dag_id=dag_id,
        task_id=task_id,
        run_id="scheduled__2026-11-23T10:00:00+00:00",
        try_number=1,
        log_url="http://127.0.0.1:18088/dags/relay_health/runs/x/tasks/check_health",
    )
    return {"ti": ti, "run_id": ti.run_id, "exception": exc}


def test_critical_health_report_is_posted_as_json_to_the_connection(endpoint, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RELAY_ALERTS", f"{endpoint.base}/alerts")  # URI form: path = schema
    RelayAlertNotifier()(failure_context(HealthCriticalError(critical_report())))
    got = endpoint.received.get(timeout=5)
    assert got["path"] == "/alerts"
    assert got["headers"]["Content-Type"] == "application/json"
    body = got["body"]
    assert (body["kind"], body["pipeline"], body["status"], body["report_id"]) == (
        "health",
        "orders",
        "CRITICAL",
        42,
    )
    assert body["summary"].splitlines()[0] == "orders: CRITICAL"
    assert "STALL on partition(s) [1]" in body["summary"] and "-> read the driver log" in body["summary"]
    assert [c["name"] for c in body["checks"]] == ["progress"]  # only what is not OK
    assert (body["dag_id"], body["task_id"], body["try_number"]) == ("relay_health", "check_health", 1)
    assert endpoint.received.empty()  # exactly one POST


def test_endpoint_extra_headers_and_bearer_token_come_from_the_connection(endpoint, monkeypatch) -> None:
    conn = {
        "conn_type": "http",
        "host": "127.0.0.1",
        "port": endpoint.server_address[1],
        "password": "s3cret-token",
        "extra": {"endpoint": "/hooks/relay", "headers": {"X-Team": "data"}},
    }
    monkeypatch.setenv("AIRFLOW_CONN_OPS_PAGER", json.dumps(conn))
    assert RelayAlertsHook("ops_pager").url() == f"{endpoint.base}/hooks/relay"
    RelayAlertNotifier(conn_id="ops_pager")(failure_context(HealthCriticalError(critical_report())))
    got = endpoint.received.get(timeout=5)
    assert got["path"] == "/hooks/relay"
    assert got["headers"]["Authorization"] == "Bearer s3cret-token"
    assert got["headers"]["X-Team"] == "data"


def test_without_the_connection_the_alert_is_logged_at_error(monkeypatch, caplog) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_RELAY_ALERTS", raising=False)
    with caplog.at_level(logging.INFO):
        RelayAlertNotifier()(failure_context(HealthCriticalError(critical_report())))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    text = errors[0].getMessage()
    assert text.startswith("RELAY ALERT [CRITICAL] orders: CRITICAL")
    assert "STALL on partition(s) [1]" in text and "no connection 'relay_alerts'" in text


def test_an_endpoint_that_fails_leaves_the_alert_in_the_log(endpoint, monkeypatch, caplog) -> None:
    endpoint.status = 500
    monkeypatch.setenv("AIRFLOW_CONN_RELAY_ALERTS", f"{endpoint.base}/alerts")
    with caplog.at_level(logging.INFO):
        RelayAlertNotifier()(failure_context(HealthCriticalError(critical_report())))
    assert endpoint.received.get(timeout=5)["body"]["status"] == "CRITICAL"  # it was tried
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "NOT delivered" in errors[0] and "answered 500" in errors[0]
    assert "STALL on partition(s) [1]" in errors[0]


def test_an_operation_failure_is_alerted_with_its_error(endpoint, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RELAY_ALERTS", f"{endpoint.base}/alerts")
    exc = OperationError("pipeline orders is already running: instance 3")
    RelayAlertNotifier()(failure_context(exc, dag_id="relay_deploy", task_id="deploy"))
    body = endpoint.received.get(timeout=5)["body"]
    assert (body["kind"], body["status"]) == ("task_failure", "FAILED")
    assert (
        body["summary"]
        == "relay_deploy.deploy failed: OperationError: pipeline orders is already running: instance 3"
    )
