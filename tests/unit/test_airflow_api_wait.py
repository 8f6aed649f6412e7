"""Waiting for a DAG run survives an api-server that is too busy to answer one poll in time.

A real HTTP server on loopback plays the api-server: its first poll answers after the client's read
timeout, the next ones say ``running`` then ``success``. Any HTTP error answer still fails at once, and
so does an answer the generated client's models refuse (each names the URL and the call). The runs it
answers carry the fields Airflow's OpenAPI requires of a ``DAGRunResponse``: the client validates them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from relay.config import Ports, RelayConfig
from relay.errors import StackError
from relay_dev.airflow_api import ADMIN_USER, ApiAnswer, passwords_file, wait_dag_run


def run(state: str) -> dict:
    """A dag run as the api-server answers it (the fields the OpenAPI schema requires)."""
    return {
        "dag_id": "relay_deploy",
        "dag_display_name": "relay_deploy",
        "dag_run_id": "r1",
        "dag_versions": [],
        "run_after": "2026-11-28T19:00:00Z",
        "run_type": "manual",
        "state": state,
    }


class FakeApiServer(BaseHTTPRequestHandler):
    script: list[tuple[float, int, dict]] = []  # (delay s, status, body) per GET of the run
    polls = 0

    def do_POST(self) -> None:  # /auth/token
        self._answer(201, {"access_token": "t"})

    def do_GET(self) -> None:
        step = FakeApiServer.script[min(FakeApiServer.polls, len(FakeApiServer.script) - 1)]
        FakeApiServer.polls += 1
        time.sleep(step[0])
        self._answer(step[1], step[2])

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on a slow answer
            pass

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[RelayConfig]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = RelayConfig(data_dir=tmp_path, ports=Ports(airflow=server.server_address[1]))
    passwords_file(config).parent.mkdir(parents=True)
    passwords_file(config).write_text(json.dumps({ADMIN_USER: "pw"}))
    FakeApiServer.polls = 0
    try:
        yield config
    finally:
        server.shutdown()
        server.server_close()


def test_a_poll_answered_too_late_is_polled_again(api: RelayConfig) -> None:
    FakeApiServer.script = [(1.5, 200, run("running")), (0, 200, run("running")), (0, 200, run("success"))]
    ended = wait_dag_run(api, "relay_deploy", "r1", timeout=30, request_timeout_s=0.5)
    assert ended.state.value == "success" and ended.dag_run_id == "r1"
    assert FakeApiServer.polls == 3  # the client retried nothing by itself: each poll is one request


def test_an_error_answer_fails_at_once(api: RelayConfig) -> None:
    FakeApiServer.script = [(0, 404, {"detail": "no such run"})]
    with pytest.raises(ApiAnswer, match="HTTP 404") as raised:
        wait_dag_run(api, "relay_deploy", "r1", timeout=30, request_timeout_s=0.5)
    assert raised.value.status == 404 and FakeApiServer.polls == 1
    message = str(raised.value)
    assert "\n" not in message and f"127.0.0.1:{api.ports.airflow}" in message
    assert "DagRunApi.get_dag_run('relay_deploy', 'r1')" in message


def test_an_answer_outside_the_schema_fails_at_once_naming_the_call(api: RelayConfig) -> None:
    FakeApiServer.script = [(0, 200, {"state": "running"})]  # no dag_id, run_type, ...
    with pytest.raises(StackError, match=r"DagRunApi\.get_dag_run\('relay_deploy', 'r1'\).*dag_id"):
        wait_dag_run(api, "relay_deploy", "r1", timeout=30, request_timeout_s=0.5)
    assert FakeApiServer.polls == 1


def test_a_server_that_never_answers_in_time_fails_at_the_deadline(api: RelayConfig) -> None:
    FakeApiServer.script = [(1.0, 200, run("running"))]
    with pytest.raises(StackError, match="still unanswered"):
        wait_dag_run(api, "relay_deploy", "r1", timeout=2, request_timeout_s=0.3)
