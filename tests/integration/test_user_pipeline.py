"""A user's pipeline (examples/json_upsert) on real parts: noida-db, the Spark cluster, PostgreSQL.

The executors upsert JSON records by id into a PostgreSQL table through PostgresUpsertSink; the
driver only moves cursors in the PostgreSQL ledger. A task dying inside its upsert transaction, a
SIGKILL of the driver mid-stream and a driver dying after its tasks wrote and before its ledger
commit each replay a batch: the table, read with SQL, must still hold exactly the newest value per
id and the audit be clean. The path users run (issue #29), so it is in ``make test``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from relay.artifacts import build_artifact
from relay.audit import audit, render
from relay.config import RelayConfig
from relay.crashpoints import CRASH_ONCE_DIR_ENV, arm_once
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.models import AttemptState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.status import status_view
from relay.operations.stop import stop

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, print_drivers, python_driver_pid, wait_relaunched
from tests.integration.json_users import EXAMPLE, IDS, expected, produce_versions, table

# make test-long: test_user_pipeline_dags runs this example through the same kills (a task inside its
# upsert transaction, the driver between its tasks' writes and its commit) by the DAGs, then an
# upgrade and a recovery; this CLI variant adds a SIGKILL mid-stream (the short chaos run has those).
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _files_containing(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_user_pipeline_upserts_newest_per_id_through_task_and_driver_kills(
    stack: RelayConfig, postgres_url: str, sink_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = stack.with_(pipeline="json_upsert", topic="json_upsert", ledger_url=postgres_url)
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(tmp_path))  # forwarded to the driver and its tasks
    try:
        _scenario(cfg, sink_url, monkeypatch, tmp_path)
    except AssertionError:
        print_drivers(cfg)
        raise


def _scenario(cfg: RelayConfig, sink_url: str, monkeypatch: pytest.MonkeyPatch, faults: Path) -> None:
    monkeypatch.setenv("JSON_UPSERT_SINK_URL", sink_url)  # where relay deploy runs: copied to the driver
    ledger = Ledger(cfg.ledger_url)
    art = build_artifact(cfg, "ju1", pipeline_code=EXAMPLE)
    assert art.job_file.name == "pipeline_driver.py" and len(art.pipeline["code_hash"]) == 64
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    total = produce_versions(cfg.kafka_bootstrap, cfg.topic, range(5))
    arm_once(str(faults), "pg_sink.before_commit")  # the first task to get there dies uncommitted
    first = deploy(cfg, version="ju1", wait_s=300)
    inst_id = first["instance_id"]
    wait_for("the backlog to be applied", lambda: caught_up(cfg, ledger), timeout=240, interval=1)
    assert not (faults / "pg_sink.before_commit").exists(), "no task reached the armed crash point"
    assert table(sink_url) == expected(4)

    # Updates keep coming while the driver is SIGKILLed mid-stream; the master relaunches it.
    producer = threading.Thread(
        target=produce_versions, args=(cfg.kafka_bootstrap, cfg.topic, range(5, 30), 250.0)
    )
    producer.start()
    try:
        attempt_id, pid = python_driver_pid(ledger, inst_id)
        batches = len(ledger.recent_batches(cfg.pipeline, 1000, inst_id))
        wait_for(
            "batches during the updates",
            lambda: len(ledger.recent_batches(cfg.pipeline, 1000, inst_id)) >= batches + 1,
            timeout=120,
        )
        os.kill(pid, signal.SIGKILL)
        wait_relaunched(ledger, inst_id, attempt_id, timeout=180)
    finally:
        producer.join()
    total += 25 * IDS + 1
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    assert table(sink_url) == expected(29)

    # The driver dies after its tasks upserted, before the ledger commit: the replay changes nothing.
    attempts = len(ledger.attempts(inst_id))
    arm_once(str(faults), "pipeline.before_ledger_commit")
    total += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(29, 30))
    wait_for("the armed driver crash", lambda: not (faults / "pipeline.before_ledger_commit").exists(), 120)
    wait_for("the relaunch", lambda: len(ledger.attempts(inst_id)) == attempts + 1, timeout=240)
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    assert table(sink_url) == expected(29)

    # A backlog 100x the batches so far: the driver's memory must not follow the batch size.
    def newest_batches(seen: int) -> list[dict]:
        done = ledger.recent_batches(cfg.pipeline, 10_000, inst_id)  # newest first
        return done[: len(done) - seen]

    seen = len(ledger.recent_batches(cfg.pipeline, 10_000, inst_id))
    total += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(30, 31))  # one small batch
    wait_for("the small batch to be applied", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    small = max(b["rows_read"] for b in newest_batches(seen))
    py_pid = [a for a in ledger.attempts(inst_id) if a.state is AttemptState.RUNNING][-1].pid
    jvm_pid = _ppid(py_pid)
    jvm_args = Path(f"/proc/{jvm_pid}/cmdline").read_bytes().split(b"\0")
    assert b"-XX:TieredStopAtLevel=1" in jvm_args, "the driver's JVM should compile with C1 only"
    before = (_kib(py_pid, "VmHWM"), _kib(jvm_pid, "VmRSS"))
    seen = len(ledger.recent_batches(cfg.pipeline, 10_000, inst_id))
    total += produce_versions(cfg.kafka_bootstrap, cfg.topic, range(31, 131))
    wait_for("the big backlog to be applied", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    after = (_kib(py_pid, "VmHWM"), _kib(jvm_pid, "VmRSS"))
    big = max(b["rows_read"] for b in newest_batches(seen))
    print(
        f"MEMORY batch rows {small} -> {big}; "
        f"Python driver peak {before[0] // 1024} -> {after[0] // 1024} MiB; "
        f"driver JVM RSS {before[1] // 1024} -> {after[1] // 1024} MiB"
    )
    assert big >= 10 * max(small, 1)  # adaptive batches (issue #31): the backlog's batches are large
    assert after[0] - before[0] < 64 * 1024, "the Python driver's peak memory grew with the batch size"
    assert table(sink_url) == expected(130)

    report = audit(cfg, ledger, deep=True, sink=True)  # relay audit --deep: it reads the sink too
    assert report.ok, render(report.to_json())
    assert report.sink is not None and report.sink.kind == "upsert" and report.sink.counts["ok"] > 0
    assert sum(p.applied_once for p in report.partitions) == total and report.totals["unread"] == 0
    assert any("executor-side sink" in n for n in report.notes)

    # The records never reached the driver: every batch's counts are the tasks' sums and its
    # ranges are cursor moves of the executor sink.
    records = ledger.recent_batches(cfg.pipeline, 10_000, inst_id)
    assert all(r["sink"] == "executor" for b in records for r in b["ranges"])
    assert IDS <= sum(b["rows_applied"] for b in records) <= sum(b["rows_read"] for b in records)
    junk = 5  # one per produce_versions() call: the transform drops them before the sink
    assert sum(b["rows_read"] for b in records) >= total - junk

    # The sink's URL reached the driver in its environment only: no log, argv or status shows it.
    shown = json.dumps(status_view(cfg), default=str)
    assert sink_url not in shown
    needle = sink_url.encode()
    assert _files_containing(cfg.logs_dir, needle) + _files_containing(cfg.spark_dir / "work", needle) == []

    result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True]
    assert master_apps(cfg, cfg.pipeline) == []
    assert audit(cfg, ledger).ok
