"""SparkStandaloneClient parsing and request building, on responses recorded from a real master."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from relay.config import PROJECT_ROOT, load_config
from relay.errors import SparkError
from relay.spark.driver_properties import driver_properties
from relay.spark.rest import (
    PYTHON_RUNNER,
    AppState,
    DriverState,
    MasterState,
    SparkStandaloneClient,
    create_request,
    parse_create_response,
    parse_status_response,
)

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def test_master_state_with_active_app_parses_apps_drivers_and_workers() -> None:
    state = MasterState.from_json(fixture("master_json_active_app.json"))
    assert state.alive and state.status == "ALIVE"
    assert state.workers_alive == 1 and state.cores == 2
    assert [a.name for a in state.active_apps] == ["relay-fixture-app"]
    app = state.active_apps[0]
    assert app.state is AppState.RUNNING and app.id.startswith("app-") and app.cores == 1
    assert app.start_time_ms > 1_600_000_000_000
    assert [d.main_class for d in state.active_drivers] == [PYTHON_RUNNER]
    assert state.active_drivers[0].state is DriverState.RUNNING
    assert state.active_drivers[0].worker == state.workers[0].id
    assert state.workers[0].state == "ALIVE" and state.workers[0].webui.startswith("http://127.0.0.1:")


def test_master_state_after_finish_lists_completed_apps_and_no_active_ones() -> None:
    state = MasterState.from_json(fixture("master_json_completed.json"))
    assert state.active_apps == [] and state.active_drivers == []
    assert {a.state for a in state.completed_apps} == {AppState.FINISHED}
    assert {d.state for d in state.completed_drivers} == {DriverState.FINISHED}


def test_create_response_accepted_returns_submission_id() -> None:
    body = fixture("create_response.json")
    assert parse_create_response(body) == body["submissionId"]
    assert body["submissionId"].startswith("driver-")


def test_create_response_refused_raises_spark_error_with_server_message() -> None:
    with pytest.raises(SparkError, match="Malformed request"):
        parse_create_response(fixture("create_refused.json"))


@pytest.mark.parametrize(
    ("name", "state"),
    [
        ("status_running.json", DriverState.RUNNING),
        ("status_finished.json", DriverState.FINISHED),
        ("status_not_found.json", DriverState.NOT_FOUND),
    ],
)
def test_status_response_maps_to_driver_state(name: str, state: DriverState) -> None:
    assert parse_status_response(fixture(name)) is state


def test_unknown_driver_state_is_unknown_not_an_error() -> None:
    assert DriverState.parse("SOMETHING_NEW") is DriverState.UNKNOWN
    assert DriverState.FINISHED.is_final and not DriverState.RELAUNCHING.is_final


def test_create_request_runs_the_script_through_python_runner() -> None:
    body = create_request("app.py", ["--x", "1"], {"spark.submit.pyFiles": "/a.zip,/b.py"}, {"K": "V"})
    app = str(Path("app.py").resolve())
    assert body["mainClass"] == PYTHON_RUNNER
    assert body["appResource"] == f"file:{app}"
    assert body["appArgs"] == [app, "/a.zip,/b.py", "--x", "1"]
    assert body["environmentVariables"] == {"K": "V"}


def test_driver_properties_keep_everything_under_the_data_dir(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path / "data")})
    props = driver_properties(config, "relay-x", True, ["/p/mod.py"], extra={"spark.executor.memory": "1g"})
    assert props["spark.master"] == config.spark_master_url
    assert props["spark.submit.deployMode"] == "cluster"
    assert props["spark.app.name"] == "relay-x" and props["spark.driver.supervise"] == "true"
    assert props["spark.submit.pyFiles"] == "/p/mod.py"
    assert props["spark.executor.memory"] == "1g" and props["spark.cores.max"] == "1"
    for key in ("spark.local.dir", "spark.python.unix.domain.socket.dir"):
        assert props[key].startswith(str(config.spark_dir))
    assert f"-Djava.io.tmpdir={config.spark_dir}" in props["spark.driver.extraJavaOptions"]
    assert str(PROJECT_ROOT / "include") in props["spark.driverEnv.PYTHONPATH"]
    # Nothing of Spark's own goes to /tmp. The checkout itself may live there (a clone under /tmp,
    # issue #34): its paths are the code's, not scratch files.
    outside = [v.replace(str(PROJECT_ROOT), "") for v in props.values() if str(tmp_path) not in v]
    assert not any("/tmp" in v for v in outside), props


class _Reply:
    def __init__(self, body: Any, status: int = 200) -> None:
        self.body, self.status_code, self.text = body, status, json.dumps(body)

    def json(self) -> Any:
        return self.body


def test_client_submit_posts_create_and_returns_id(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake(self: requests.Session, method: str, url: str, **kwargs: Any) -> _Reply:
        seen.update(method=method, url=url, **kwargs)
        return _Reply(fixture("create_response.json"))

    monkeypatch.setattr(requests.Session, "request", fake)
    client = SparkStandaloneClient("http://127.0.0.1:1", "http://127.0.0.1:2/", timeout_s=3)
    sid = client.submit_python("app.py", [], {"spark.master": "spark://x"})
    assert sid.startswith("driver-")
    assert seen["method"] == "POST" and seen["url"] == "http://127.0.0.1:2/v1/submissions/create"
    assert seen["timeout"] == 3 and seen["json"]["mainClass"] == PYTHON_RUNNER


def test_client_wraps_connection_errors_in_spark_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: requests.Session, method: str, url: str, **kwargs: Any) -> _Reply:
        raise requests.ConnectionError("refused")

    monkeypatch.setattr(requests.Session, "request", boom)
    client = SparkStandaloneClient("http://127.0.0.1:1", "http://127.0.0.1:2")
    with pytest.raises(SparkError, match="127.0.0.1:1/json/"):
        client.master_state()


def test_client_kill_of_unknown_driver_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        requests.Session, "request", lambda self, method, url, **kw: _Reply(fixture("kill_not_found.json"))
    )
    assert SparkStandaloneClient("http://m", "http://r").kill("driver-nope") is False
