"""relay_health through dag.test() on the real stack: a rogue application fails the run; lag is exact."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition
from relay.config import RelayConfig
from relay.kafka.producer import produce
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.sinks import ledger_messages_tables as counter_tables
from relay.spark.launcher import spark_client
from relay_dev.airflow_local import ensure_airflow_db
from sqlalchemy import func, select

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, run_dag_test, start_rogue_app, submit_copy

pytestmark = pytest.mark.integration


def test_rogue_application_fails_health_and_never_writes_then_lag_is_exact(stack: RelayConfig) -> None:
    name = f"h{uuid.uuid4().hex[:8]}"
    cfg = stack.with_(pipeline=name, topic=name, ledger_url=f"sqlite:///{stack.data_dir / (name + '.db')}")
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    deploy(cfg, wait_s=240)
    wait_for("the job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    ensure_airflow_db(cfg)

    # Two copies behind Relay's back: a real copy of the job (it would write: same code, same
    # ledger, same instance) and another application under the live instance's name.
    inst = ledger.instances(cfg.pipeline)[0]
    copy = submit_copy(cfg, ledger, inst.id, None)
    impostor = start_rogue_app(cfg, inst.app_name)
    try:
        wait_for("the copy to be refused", lambda: len(ledger.refusals(cfg.pipeline)) == 1, timeout=180)
        state, output = run_dag_test(cfg, "relay_health", {})
        assert state == "failed", output[-4000:]
        recorded = ledger.attempts(inst.id)[-1].app_id
        impostor_app = [a.id for a in spark_client(cfg).apps_named(inst.app_name) if a.id != recorded]
        assert impostor_app and impostor_app[0] in output and "CRITICAL" in output, output[-4000:]
        assert "not an attempt Relay recorded" in output and copy in output, output[-4000:]
        # the failure callback alerts; without a relay_alerts connection it logs the alert at ERROR
        assert "RELAY ALERT [CRITICAL]" in output and "no connection 'relay_alerts'" in output
    finally:
        spark_client(cfg).kill(impostor)
        spark_client(cfg).kill(copy)
    with ledger.tx() as conn:  # neither copy was allowed to write
        writers = conn.execute(
            select(counter_tables.messages.c.instance_id, func.count()).group_by(
                counter_tables.messages.c.instance_id
            )
        ).all()
    assert [w[0] for w in writers] == [inst.id]
    assert ledger.instance(inst.id).current_epoch == ledger.attempts(inst.id)[-1].epoch
    assert ledger.reports(cfg.pipeline, "health", 1)[0]["status"] == "CRITICAL"

    # Stopped on purpose with messages waiting: no page (STOPPED), and the persisted report's lag
    # equals what kafka-python reports.
    stop(cfg)
    produce(cfg.kafka_bootstrap, cfg.topic, 150, None, partitions=cfg.partitions)
    state, output = run_dag_test(cfg, "relay_health", {})
    assert state == "success", output[-4000:]
    body = ledger.reports(cfg.pipeline, "health", 1)[0]["body"]
    reported = {row["partition"]: row["lag"] for row in body["data"]["offsets"]}
    consumer = KafkaConsumer(bootstrap_servers=cfg.kafka_bootstrap)
    try:
        tps = [TopicPartition(cfg.topic, p) for p in reported]
        ends = consumer.end_offsets(tps)
    finally:
        consumer.close()
    cursors = {le.partition: le.next_offset for le in ledger.pipeline_leases(cfg.pipeline) if not le.drained}
    assert reported == {tp.partition: ends[tp] - cursors[tp.partition] for tp in tps}
    assert sum(reported.values()) == 150
    assert body["data"]["run_state"] == "STOPPED", body["data"]["run_state"]
    paged = {c["name"]: c["level"] for c in body["checks"] if c["level"] != "OK"}
    assert paged == {"single_instance": "WARN"}, paged  # only the copies refused within the hour
