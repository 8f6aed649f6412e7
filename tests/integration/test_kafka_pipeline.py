"""A user's Kafka-to-Kafka pipeline (examples/kafka_to_kafka) on real parts: the broker, the Spark
cluster, a PostgreSQL ledger.

The executors filter and reshape JSON events and write them through KafkaTransactionalSink; the
driver only moves cursors. A task that dies inside its Kafka transaction (rows and marker sent, not
committed) is retried by Spark; a SIGKILL of the driver mid-stream, and a driver dying after its tasks
wrote and before the ledger commit, replay the in-flight batch: a read_committed consumer must still
see exactly one output record per kept input event, the audit be clean and the stop graceful.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from relay.artifacts import build_artifact
from relay.audit import audit
from relay.config import PROJECT_ROOT, RelayConfig
from relay.crashpoints import CRASH_ONCE_DIR_ENV, arm_once
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.stop import stop
from relay.sinks import kafka_clients as kc
from relay.sinks.kafka_transactional import KafkaTransactionalSink

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, print_drivers, python_driver_pid, wait_relaunched

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = PROJECT_ROOT / "examples" / "kafka_to_kafka"
OUTPUT = "kafka_to_kafka_purchases"
KINDS = ("purchase", "view", "purchase", "refund", "purchase")  # 3 in 5 are purchases


def event(n: int) -> dict:
    """Event ``n``: a purchase with a positive amount is kept unless ``n % 7 == 0`` (amount 0)."""
    return {"id": n, "kind": KINDS[n % 5], "user": f"u{n % 13}", "amount": 0.0 if n % 7 == 0 else n / 4}


def kept(ids: range) -> set[int]:
    return {n for n in ids if KINDS[n % 5] == "purchase" and n % 7 != 0}


def produce(bootstrap: str, topic: str, ids: range, rate: float | None = None) -> int:
    """The events ``ids`` (keyed by user) plus one value that is not JSON; how many were sent."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    t0 = time.monotonic()
    try:
        for sent, n in enumerate(ids, 1):
            e = event(n)
            producer.send(topic, key=e["user"].encode(), value=json.dumps(e).encode())
            if rate and sent % 50 == 0:
                time.sleep(max(0.0, sent / rate - (time.monotonic() - t0)))
        producer.send(topic, key=b"junk", value=b"not json")  # dropped by the transform
        producer.flush(60)
    finally:
        producer.close()
    return len(ids) + 1


def read_committed(bootstrap: str, topic: str, timeout_s: float = 120.0) -> Counter:
    """Every output value of the whole topic a read_committed consumer sees, counted by id."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)  # read_committed: the last stable offset
        consumer.seek_to_beginning(*tps)
        seen: Counter = Counter()
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for records in consumer.poll(timeout_ms=200).values():
                for r in records:
                    if r.offset < ends[TopicPartition(r.topic, r.partition)]:
                        value = json.loads(r.value)
                        assert r.key == value["user"].encode() and value["cents"] == round(value["id"] * 25)
                        seen[value["id"]] += 1
        return seen
    finally:
        consumer.close()


def exactly_once(seen: Counter, want: set[int]) -> None:
    twice = sorted(i for i, c in seen.items() if c > 1)
    missing = sorted(want - set(seen))
    extra = sorted(set(seen) - want)
    assert (twice, missing, extra) == ([], [], []), (
        f"duplicates {twice[:20]} ({len(twice)}), missing {missing[:20]} ({len(missing)}), "
        f"not kept {extra[:20]} ({len(extra)})"
    )


def test_kafka_pipeline_writes_each_kept_event_once_through_task_and_driver_crashes(
    stack: RelayConfig, postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = stack.with_(pipeline="kafka_to_kafka", topic="kafka_to_kafka", ledger_url=postgres_url)
    monkeypatch.setenv("KAFKA_TO_KAFKA_BOOTSTRAP", cfg.kafka_bootstrap)  # copied to the driver by deploy
    monkeypatch.setenv(CRASH_ONCE_DIR_ENV, str(tmp_path))  # forwarded to the driver and its tasks
    try:
        _scenario(cfg, tmp_path)
    except AssertionError:
        print_drivers(cfg)
        raise
    finally:
        kc.close_all()


def _scenario(cfg: RelayConfig, faults: Path) -> None:
    ledger = Ledger(cfg.ledger_url)
    art = build_artifact(cfg, "kk1", pipeline_code=EXAMPLE)
    assert art.job_file.name == "pipeline_driver.py" and art.pipeline["name"] == "kafka_to_kafka"
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.ensure_topic(cfg.topic, cfg.partitions)
    KafkaTransactionalSink(cfg.kafka_bootstrap, OUTPUT).create_topic(cfg.partitions)
    arm_once(str(faults), "kafka_sink.before_commit")  # the first task to get there dies uncommitted
    total = produce(cfg.kafka_bootstrap, cfg.topic, range(0, 3000))
    first = deploy(cfg, version="kk1", wait_s=300)
    inst_id = first["instance_id"]
    wait_for("the backlog to be applied", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    assert not (faults / "kafka_sink.before_commit").exists(), "no task reached the armed crash point"
    assert len(ledger.attempts(inst_id)) == 1, "a task crash is Spark's to retry, not a relaunch"
    exactly_once(read_committed(cfg.kafka_bootstrap, OUTPUT), kept(range(0, 3000)))

    # Events keep coming while the driver is SIGKILLed mid-stream; the master relaunches it.
    producer = threading.Thread(
        target=produce, args=(cfg.kafka_bootstrap, cfg.topic, range(3000, 9000), 300.0)
    )
    producer.start()
    try:
        attempt_id, pid = python_driver_pid(ledger, inst_id)
        batches = len(ledger.recent_batches(cfg.pipeline, 1000, inst_id))
        wait_for(
            "batches during the stream",
            lambda: len(ledger.recent_batches(cfg.pipeline, 1000, inst_id)) >= batches + 1,
            timeout=180,
        )
        os.kill(pid, signal.SIGKILL)
        wait_relaunched(ledger, inst_id, attempt_id, timeout=240)
    finally:
        producer.join()
    total += 6000 + 1
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=420, interval=1)

    # A task killed mid-transaction is aborted by the replay's init_transactions: read_committed
    # consumers see each kept event once, never a record of the aborted transaction.
    exactly_once(read_committed(cfg.kafka_bootstrap, OUTPUT), kept(range(0, 9000)))

    # The driver dies after its tasks committed their transactions, before the ledger commit.
    attempts = len(ledger.attempts(inst_id))
    arm_once(str(faults), "pipeline.before_ledger_commit")
    total += produce(cfg.kafka_bootstrap, cfg.topic, range(9000, 10000))
    wait_for("the armed driver crash", lambda: not (faults / "pipeline.before_ledger_commit").exists(), 120)
    wait_for("the relaunch", lambda: len(ledger.attempts(inst_id)) == attempts + 1, timeout=240)
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    exactly_once(read_committed(cfg.kafka_bootstrap, OUTPUT), kept(range(0, 10000)))

    report = audit(cfg, ledger)
    assert report.ok, report.to_json()
    assert sum(p.applied_once for p in report.partitions) == total and report.totals["unread"] == 0
    records = ledger.recent_batches(cfg.pipeline, 10_000, inst_id)
    assert all(r["sink"] == "executor" for b in records for r in b["ranges"])

    result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True]
    assert master_apps(cfg, cfg.pipeline) == []
    assert audit(cfg, ledger).ok
