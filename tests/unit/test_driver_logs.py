"""Reading a driver's logs from its worker, on answers recorded from a real Spark 4.2.0 worker.

The recorded driver was a supervised cluster-mode Python driver dying with ModuleNotFoundError at
import (recorded after its second launch): ``worker_log_*.txt`` are raw ``GET /log/`` bodies and
``master_json_crashlooping_driver.json`` is the master's ``/json/`` at the same moment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import requests
from relay.artifacts import MISSING_MODULE, build_artifact
from relay.config import load_config
from relay.errors import OperationError, SparkError
from relay.ledger.models import Instance, InstanceState
from relay.ledger.store import Ledger
from relay.spark import driver_logs, first_commit, launcher
from relay.spark.driver_logs import (
    DriverLogUnavailable,
    LaunchCounter,
    WorkerLogs,
    count_launches,
    error_tail,
    explain_failure,
    parse_log_response,
)
from relay.spark.rest import MasterState, SparkStandaloneClient

FIXTURES = Path(__file__).parent / "fixtures"
DRIVER = "driver-20261123110305-0001"
WORKER_UI = "http://127.0.0.1:39537"
IMPORT_ERROR = "ModuleNotFoundError: No module named 'relay_no_such_module_xyz'"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def file_of(name: str) -> bytes:
    """The whole log file a recorded full read (offset 0, everything) returned."""
    chunk = parse_log_response(recorded(name))
    assert chunk.start == 0 and chunk.end == chunk.total
    return chunk.text.encode()


class _Reply:
    def __init__(self, text: str, status: int = 200) -> None:
        self.text, self.status_code = text, status

    def json(self) -> Any:
        return json.loads(self.text)


class FakeSpark:
    """Answers like the recorded master and worker.

    ``/json/`` is the recorded master state; ``/log/`` slices a log file the way Spark's worker
    LogPage does (no offset: the last byteLength bytes; offsets clamped to the file).
    """

    def __init__(self, logs: dict[str, bytes]) -> None:
        self.logs = logs
        self.reads: list[dict[str, str]] = []

    def __call__(self, method: str, url: str, **kwargs: Any) -> _Reply:
        parts = urlsplit(url)
        if parts.path == "/json/":
            return _Reply(recorded("master_json_crashlooping_driver.json"))
        assert f"{parts.scheme}://{parts.netloc}" == WORKER_UI and parts.path == "/log/", url
        params = kwargs["params"]
        self.reads.append(params)
        data = self.logs[params["logType"]]
        length = int(params["byteLength"])
        offset = int(params.get("offset", len(data) - length))
        start = min(max(offset, 0), len(data))
        end = min(start + length, len(data))
        path = f"/work/main/var/probe10/stack/spark/work/{params['driverId']}/{params['logType']}"
        text = f"==== Bytes {start}-{end} of {len(data)} of {path} ====\n" + data[start:end].decode()
        return _Reply(text)


@pytest.fixture()
def fake_spark(monkeypatch: pytest.MonkeyPatch) -> FakeSpark:
    fake = FakeSpark(
        {
            "stderr": file_of("worker_log_stderr_two_launches.txt"),
            "stdout": file_of("worker_log_stdout_traceback.txt"),
        }
    )
    monkeypatch.setattr(requests.Session, "request", lambda self, method, url, **kw: fake(method, url, **kw))
    return fake


def test_fake_worker_slices_like_the_recorded_worker() -> None:
    fake = FakeSpark({"stdout": file_of("worker_log_stdout_traceback.txt")})
    params = {"driverId": DRIVER, "logType": "stdout", "byteLength": "200"}
    assert fake("GET", f"{WORKER_UI}/log/", params=params).text == recorded("worker_log_stdout_tail_cut.txt")


def test_full_stderr_read_parses_range_and_counts_two_launches() -> None:
    chunk = parse_log_response(recorded("worker_log_stderr_two_launches.txt"))
    assert (chunk.start, chunk.end, chunk.total) == (0, 7529, 7529)
    assert chunk.path.endswith(f"/{DRIVER}/stderr")
    assert not chunk.text.startswith("====")
    assert count_launches(chunk.text) == 2


@pytest.mark.parametrize(
    ("name", "says"),
    [("worker_log_unknown_driver.txt", "invalid log directory"), ("worker_log_bad_type.txt", "Log type")],
)
def test_worker_error_answers_are_driver_log_unavailable(name: str, says: str) -> None:
    with pytest.raises(DriverLogUnavailable, match=says) as caught:
        parse_log_response(recorded(name))
    assert isinstance(caught.value, SparkError)


def test_an_empty_log_is_not_an_error() -> None:
    chunk = parse_log_response(f"==== Bytes 0-0 of 0 of /w/{DRIVER}/stdout ====\n")
    assert chunk.total == 0 and chunk.text == ""


def test_an_answer_without_the_range_header_is_a_spark_error() -> None:
    with pytest.raises(SparkError, match="unexpected answer") as caught:
        parse_log_response("<html><body>Not Found</body></html>")
    assert not isinstance(caught.value, DriverLogUnavailable)


def test_error_tail_keeps_the_last_traceback_without_caret_lines() -> None:
    text = parse_log_response(recorded("worker_log_stdout_traceback.txt")).text
    tail = error_tail(text * 3)  # three launches' output: only the last traceback counts
    lines = tail.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == IMPORT_ERROR
    assert tail.count("Traceback") == 1 and not any(set(line.strip()) == {"^"} for line in lines)
    assert len(error_tail(text, max_lines=2).splitlines()) == 2


def test_error_tail_drops_the_line_a_tail_read_started_in() -> None:
    chunk = parse_log_response(recorded("worker_log_stdout_tail_cut.txt"))
    assert chunk.start > 0 and chunk.text.startswith('"/work')
    tail = error_tail(chunk.text, cut_first_line=True)
    assert not tail.startswith('"/work') and tail.splitlines()[-1] == IMPORT_ERROR


def test_without_python_output_the_jvm_error_is_explained_not_its_chatter() -> None:
    stderr = parse_log_response(recorded("worker_log_stderr_two_launches.txt")).text
    why = explain_failure("", stderr)
    assert "SparkUserAppException: User application exited with 1" in why
    assert " INFO " not in why and "Launch Command" not in why and "=====" not in why
    assert len(why.splitlines()) <= 20


def test_launch_counter_reads_only_new_bytes_across_chunk_boundaries(
    fake_spark: FakeSpark, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_logs, "CHUNK_BYTES", 97)  # splits the launch header lines
    logs = WorkerLogs(requests.Session(), WORKER_UI, timeout_s=2)
    counter = LaunchCounter(DRIVER)
    assert counter.update(logs) == 2
    size = len(fake_spark.logs["stderr"])
    assert counter.offset == size and len(fake_spark.reads) == -(-size // 97)

    fake_spark.reads.clear()
    fake_spark.logs["stderr"] += b'Launch Command: "java" "-cp" "x"\n' + b"=" * 40 + b"\n\n"
    assert counter.update(logs) == 3
    assert int(fake_spark.reads[0]["offset"]) == size  # the old bytes were not read again
    assert counter.update(logs) == 3


def test_client_finds_the_drivers_worker_through_the_master(fake_spark: FakeSpark) -> None:
    client = SparkStandaloneClient("http://127.0.0.1:46211", "http://127.0.0.1:52403")
    assert client.worker_logs(DRIVER).webui_url == WORKER_UI
    assert client.driver_launches(DRIVER) == 2
    assert client.driver_log_tail(DRIVER, 120).splitlines()[-1] == IMPORT_ERROR
    with pytest.raises(DriverLogUnavailable, match="no worker web UI"):
        client.worker_logs("driver-20990101000000-9999")


def test_master_state_finds_active_and_completed_drivers() -> None:
    state = MasterState.from_json(json.loads(recorded("master_json_crashlooping_driver.json")))
    assert state.driver(DRIVER) is not None and state.driver(DRIVER).state.value == "RUNNING"
    completed = MasterState.from_json(json.loads(recorded("master_json_completed.json")))
    assert all(completed.driver(d.id) == d for d in completed.completed_drivers)
    assert state.driver("driver-nope") is None


def test_worker_connection_errors_and_http_errors_are_spark_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    logs = WorkerLogs(requests.Session(), WORKER_UI, timeout_s=2)

    def refused(self: requests.Session, method: str, url: str, **kwargs: Any) -> _Reply:
        raise requests.ConnectionError("refused")

    monkeypatch.setattr(requests.Session, "request", refused)
    with pytest.raises(SparkError, match="ConnectionError"):
        logs.read(DRIVER, "stderr", 0, 10)
    monkeypatch.setattr(requests.Session, "request", lambda self, m, u, **kw: _Reply("boom", 500))
    with pytest.raises(SparkError, match="HTTP 500"):
        logs.read(DRIVER, "stderr", 0, 10)


def test_start_watch_reports_a_relaunched_driver(fake_spark: FakeSpark, tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_SPARK_MASTER_UI_PORT": "46211"})
    watch = first_commit._StartWatch(config, DRIVER)
    assert watch.check(0) is None  # not yet: checks are spaced out
    assert fake_spark.reads == []
    watch._next_check = 0.0
    assert "launched 2 times without a first commit" in (watch.check(0) or "")
    assert first_commit._StartWatch(config, "local-123").check(0) is None  # local drivers: no supervisor


def test_a_driver_killed_after_it_took_its_attempt_is_no_start_failure(
    fake_spark: FakeSpark, tmp_path: Path
) -> None:
    """Issue #34: one SIGKILL of green after the handoff aborted the upgrade ("launched 2 times");
    a launch that took its attempt in the ledger got past its start: supervision brings it back."""
    config = load_config({"RELAY_DATA_DIR": str(tmp_path), "RELAY_SPARK_MASTER_UI_PORT": "46211"})
    watch = first_commit._StartWatch(config, DRIVER)
    watch._next_check = 0.0
    assert watch.check(1) is None  # two launches, one took its attempt: one crash at most
    watch._next_check = 0.0
    assert watch.check(2) is None


def test_driver_output_of_a_local_driver_reads_its_log_file(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    config.logs_dir.mkdir(parents=True)
    noise = "26/11/23 11:01:09 INFO SecurityManager: Changing view acls to: root\n" * 3000
    traceback = parse_log_response(recorded("worker_log_stdout_traceback.txt")).text
    (config.logs_dir / "relay-p-7.log").write_text(noise + traceback)
    inst = cast(Instance, SimpleNamespace(submission_id="local-999999", app_name="relay-p-7"))
    out = launcher.driver_output(config, inst)
    assert out.startswith("Traceback") and out.splitlines()[-1] == IMPORT_ERROR
    missing = cast(Instance, SimpleNamespace(submission_id="local-999999", app_name="relay-p-8"))
    assert launcher.driver_output(config, missing).startswith("(driver log unavailable")


def test_import_error_artifact_dies_at_import_and_a_real_one_does_not_change(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    broken = build_artifact(config, "v-broken", import_error=True)
    real = build_artifact(config, "v-real")
    assert MISSING_MODULE not in real.job_file.read_text()
    assert json.loads((broken.folder / "artifact.json").read_text())["import_error"] is True
    run = subprocess.run(
        [sys.executable, str(broken.job_file), "--help"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert f"ModuleNotFoundError: No module named '{MISSING_MODULE}'" in run.stderr


class _FakeLedger:
    """The three ledger reads wait_until_active makes, for an instance that never takes an attempt."""

    def __init__(self, submission: str, app: str) -> None:
        self.inst = SimpleNamespace(
            id=7, state=InstanceState.STARTING, submission_id=submission, app_name=app, error=None
        )

    def instance(self, instance_id: int) -> Any:
        return self.inst

    def attempts(self, instance_id: int) -> list[Any]:
        return []

    def leases(self, instance_id: int) -> list[Any]:
        return [SimpleNamespace(start_offset=0, next_offset=0)]


def test_wait_until_active_fails_fast_on_a_relaunched_driver_with_its_error(
    fake_spark: FakeSpark, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    monkeypatch.setattr(first_commit, "START_CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(first_commit, "driver_running", lambda config, submission: True)  # master: RUNNING
    ledger = cast(Ledger, _FakeLedger(DRIVER, "relay-p-7"))
    with pytest.raises(OperationError) as caught:
        first_commit.wait_until_active(config, ledger, 7, timeout_s=600)
    message = str(caught.value)
    assert "launched 2 times" in message and message.splitlines()[-1] == IMPORT_ERROR


def test_wait_until_active_names_the_error_of_a_local_driver_that_exited(tmp_path: Path) -> None:
    config = load_config({"RELAY_DATA_DIR": str(tmp_path)})
    config.logs_dir.mkdir(parents=True)
    log = config.logs_dir / "relay-p-7.log"
    with log.open("ab") as out:
        proc = subprocess.run(
            [sys.executable, "-c", f"import {MISSING_MODULE}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    assert proc.returncode != 0
    # The pid of a child that exited and was reaped (reuse of a pid within the test is unlikely).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger = cast(Ledger, _FakeLedger(f"local-{dead.pid}", "relay-p-7"))
    with pytest.raises(OperationError, match="is not running") as caught:
        first_commit.wait_until_active(config, ledger, 7, timeout_s=600)
    assert str(caught.value).splitlines()[-1] == f"ModuleNotFoundError: No module named '{MISSING_MODULE}'"
