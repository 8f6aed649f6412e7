"""Per-batch round trips the driver saves (issue #11), with the same outcome as before.

- the source's ``reportLatestOffset`` (Spark calls it right after ``latestOffset`` in every trigger,
  for the progress' lag only) reuses the broker end offsets ``latestOffset`` just read, once;
- ``prepare_tasks``/``commit_cursors`` read the pipeline's leases (to adopt a
  partition added to the topic) only when the instance's own leases do not cover the batch.
"""

from __future__ import annotations

from typing import Any

import kafka_source
import pytest
from kafka_source_options import SourceSettings
from pyspark.sql.streaming.datasource import ReadMaxRows
from relay.ledger.models import Color
from relay.ledger.store import Ledger
from relay.protocol import commit_cursors, prepare_tasks
from relay.sinks.base import TaskResult

T = "users"


class _Offsets:
    """Stands in for the broker: counts the end-offset look-ups."""

    def __init__(self) -> None:
        self.lookups = 0
        self.latest = {(T, 0): 50, (T, 1): 70}

    def __call__(self, tps: list[Any]) -> tuple[dict, dict]:
        self.lookups += 1
        return dict.fromkeys(self.latest, 0), dict(self.latest)


@pytest.fixture()
def reader(monkeypatch: pytest.MonkeyPatch) -> tuple[kafka_source.KafkaStreamReader, _Offsets]:
    r = kafka_source.KafkaStreamReader(SourceSettings(bootstrap_servers="127.0.0.1:1", topics=(T,)))
    offsets = _Offsets()
    monkeypatch.setattr(r, "_topic_partitions", lambda: [])
    monkeypatch.setattr(r, "_offsets", offsets)
    return r, offsets


def test_report_latest_offset_reuses_the_ends_latest_offset_just_read_once(reader) -> None:
    r, offsets = reader
    end = r.latestOffset({T: {"0": 0, "1": 0}}, ReadMaxRows(10))
    assert 0 < sum(end[T].values()) <= 10 and offsets.lookups == 1
    offsets.latest = {(T, 0): 51, (T, 1): 71}  # the broker moved on meanwhile
    assert r.reportLatestOffset() == {T: {"0": 50, "1": 70}}, "the ends latestOffset read"
    assert offsets.lookups == 1
    assert r.reportLatestOffset() == {T: {"0": 51, "1": 71}}, "used once: a second call looks up"
    assert offsets.lookups == 2


def test_report_latest_offset_looks_up_when_the_plan_is_old(reader, monkeypatch) -> None:
    r, offsets = reader
    clock = [1000.0]
    monkeypatch.setattr(kafka_source.time, "monotonic", lambda: clock[0])
    r.latestOffset({T: {"0": 0, "1": 0}}, ReadMaxRows(10))
    clock[0] += kafka_source.REPORT_REUSE_S + 0.1
    r.reportLatestOffset()
    assert offsets.lookups == 2


# ------------------------------------------------------------------ the ledger's per-batch queries
def _started(ledger: Ledger, starts: dict[int, int]):
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p")
        for part, off in starts.items():
            ledger.open_lease(conn, inst, T, part, off)
    return inst, ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))


def _count_pipeline_leases(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = Ledger.pipeline_leases

    def spy(self: Ledger, pipeline: str, conn: Any = None) -> Any:
        calls.append(pipeline)
        return real(self, pipeline, conn)

    monkeypatch.setattr(Ledger, "pipeline_leases", spy)
    return calls


def test_a_batch_on_held_partitions_does_not_read_the_pipelines_leases(ledger, monkeypatch) -> None:
    inst, att = _started(ledger, {0: 0, 1: 10})
    calls = _count_pipeline_leases(monkeypatch)
    end = {T: {0: 5, 1: 12}}
    ranges, _ = prepare_tasks(ledger, att, None, end, None)
    assert ranges == {(T, 0): (0, 5), (T, 1): (10, 12)}
    result = commit_cursors(ledger, att, 0, None, end, TaskResult(7, 7, 0, 0))
    assert [(r["partition"], r["from"], r["to"]) for r in result.ranges] == [(0, 0, 5), (1, 10, 12)]
    assert calls == [], "every partition of the batch is the instance's: nothing to adopt"


def test_a_partition_added_to_the_topic_is_still_adopted(ledger, monkeypatch) -> None:
    inst, att = _started(ledger, {0: 0})
    calls = _count_pipeline_leases(monkeypatch)
    start, end = {T: {0: 0, 1: 0}}, {T: {0: 5, 1: 3}}
    ranges, _ = prepare_tasks(ledger, att, start, end, None)
    assert ranges == {(T, 0): (0, 5), (T, 1): (0, 3)}, "the new partition's range is written too"
    assert calls, "a partition without a lease of the instance: the pipeline's leases decide"
    commit_cursors(ledger, att, 0, start, end, TaskResult(8, 8, 0, 0))
    assert sorted((le.partition, le.next_offset) for le in ledger.leases(inst.id)) == [(0, 5), (1, 3)]


def test_a_partition_another_instance_holds_is_not_adopted(ledger) -> None:
    inst, att = _started(ledger, {0: 0})
    with ledger.tx() as conn:
        other = ledger.create_instance(conn, "p", "v2", Color.GREEN, "/nonexistent", "relay-p2")
        ledger.open_lease(conn, other, T, 1, 0)
    ranges, _ = prepare_tasks(ledger, att, None, {T: {0: 5, 1: 3}}, None)
    assert ranges == {(T, 0): (0, 5)}, "partition 1 is another instance's: never this one's"
    assert [(le.partition) for le in ledger.leases(inst.id)] == [0]


# ------------------------------------------------------------------ the driver's per-batch log line
class _Progress:
    def __init__(self, batch_id: int, timestamp: str, duration_ms: dict[str, int]) -> None:
        self.batchId, self.timestamp, self.durationMs, self.numInputRows = batch_id, timestamp, duration_ms, 9


class _Query:
    def __init__(self) -> None:
        self.lastProgress: Any = None


def test_each_batchs_spark_steps_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    from query_progress import log_progress

    q = _Query()
    caplog.set_level("INFO", logger="relay.job")
    assert log_progress(q, None) is None
    q.lastProgress = _Progress(3, "t1", {"addBatch": 900, "walCommit": 70, "triggerExecution": 1000})
    key = log_progress(q, None)
    assert log_progress(q, key) == key
    q.lastProgress = _Progress(3, "t2", {"latestOffset": 9, "triggerExecution": 10})  # no data: not logged
    assert log_progress(q, key) == key
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["batch 3: 9 rows; Spark's steps (ms): addBatch 900, triggerExecution 1000, walCommit 70"]
