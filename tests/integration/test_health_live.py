"""run_health against the real embedded stack (noida-db Kafka and a Spark master), no driver needed.

What only a live stack shows: offsets, the topic's retention.ms and the master's application list come
from the real clients, and retention (``delete_records``) overtaking the ledger's cursor is reported
as invalidated with the recovery to run.
"""

from __future__ import annotations

import time
import uuid

import pytest
from relay.config import RelayConfig
from relay.health import Level, PartitionStatus, run_health
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.models import Color, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import create_instance

pytestmark = pytest.mark.integration


def test_health_of_a_stopped_pipeline_then_retention_overtakes_it(stack: RelayConfig, tmp_path) -> None:
    name = f"health-{uuid.uuid4().hex[:8]}"
    config = stack.with_(pipeline=name, topic=name, partitions=2, ledger_url=f"sqlite:///{tmp_path / 'l.db'}")
    ledger = Ledger(config.ledger_url, create=True)
    try:
        with KafkaOffsets(config.kafka_bootstrap) as kafka:
            kafka.ensure_topic(config.topic, 2, {"retention.ms": "3600000"})
        inst, _ = create_instance(config, ledger, "v1", Color.BLUE)  # leases at the earliest offsets (0)
        ledger.set_instance(inst.id, state=InstanceState.STOPPED)  # never launched: nothing runs it
        produce(config.kafka_bootstrap, config.topic, 200, None, partitions=2)

        report = run_health(config, ledger)
        assert report.down and report.check("single_instance").data["master_error"] is None
        lags = {d["partition"]: d["lag"] for d in report.check("lag").data["partitions"]}
        assert sum(lags.values()) == 200
        # seconds of lag from the timestamp of the record at each cursor (read with kafka-python):
        # the records were produced moments ago, whatever rate any window would suggest
        ages = [
            (d["lag_seconds"], d["lag_seconds_method"])
            for d in report.check("lag").data["partitions"]
            if d["lag"]
        ]
        assert ages and all(m == "record_timestamp" and 0 <= s < 120 for s, m in ages), ages
        statuses = {d["status"] for d in report.check("progress").data["partitions"] if d["lag"]}
        assert statuses == {PartitionStatus.STOP.value}
        assert report.check("retention").data["retention_ms"] == 3_600_000
        assert report.status is Level.CRITICAL and "relay_deploy" in report.summary()

        with KafkaOffsets(config.kafka_bootstrap) as kafka:
            latest = kafka.latest(config.topic)
            kafka.delete_records(config.topic, {p: off // 2 for p, off in latest.items() if off})
        after = run_health(config, ledger)
        retention = after.check("retention")
        assert retention.level is Level.CRITICAL and "invalidated" in retention.message
        assert "relay_recover" in retention.action and retention.data["suggested_strategy"] == "earliest"
        assert len(ledger.reports(name, "health", 10)) == 2
    finally:
        ledger.close()


def test_a_missing_topic_is_the_normal_start_before_a_deploy_and_critical_after(
    stack: RelayConfig, tmp_path
) -> None:
    """The broker answers and the topic does not exist: before any deploy that is how every pipeline
    starts (WARN, not "Kafka unreachable"); once the pipeline has run on it, the topic was deleted."""
    name = f"notopic-{uuid.uuid4().hex[:8]}"
    config = stack.with_(pipeline=name, topic=name, ledger_url=f"sqlite:///{tmp_path / 'l.db'}")
    ledger = Ledger(config.ledger_url, create=True)
    try:
        fresh = run_health(config, ledger)
        kafka = fresh.check("kafka")
        assert kafka.level is Level.WARN and "does not exist yet" in kafka.message
        assert "unreachable" not in fresh.summary() and fresh.status is Level.WARN

        inst, _ = create_instance(config, ledger, "v1", Color.BLUE)  # creates the topic
        ledger.set_instance(inst.id, state=InstanceState.STOPPED)
        with KafkaOffsets(config.kafka_bootstrap) as kafka:
            kafka.admin().delete_topics([config.topic])
            deadline = time.monotonic() + 30
            while config.topic in kafka.topics() and time.monotonic() < deadline:
                time.sleep(0.2)  # polling the broker's view with a deadline, not a fixed wait
        after = run_health(config, ledger)
        assert after.check("kafka").level is Level.CRITICAL and "was deleted" in after.check("kafka").message
        assert after.status is Level.CRITICAL
    finally:
        ledger.close()
