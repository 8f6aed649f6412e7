"""The health check relaunches an ACTIVE instance whose driver Spark killed for good, by itself.

What a person had to do before (chaos run of stop 17: a recovered master had a just-relaunched
driver killed; the ledger said ACTIVE, nothing ran): ``relay stop`` + ``relay deploy``. Here the
driver is killed through the Spark REST API (final: supervision never relaunches a KILLED driver),
load keeps coming, and ``run_health(heal=True)`` (what the relay_health DAG runs) must bring the same
instance back under a new submission, once, with every record applied exactly once by the audit.
"""

from __future__ import annotations

import threading

import pytest
from relay.audit import audit
from relay.config import RelayConfig
from relay.health import Level, run_health
from relay.kafka.producer import produce
from relay.ledger.models import AttemptState, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.heal import REPORT_KIND
from relay.operations.stop import stop
from relay.spark.launcher import driver_running, spark_client
from relay.spark.rest import DriverState

from tests.conftest import wait_for
from tests.integration.helpers import caught_up

pytestmark = pytest.mark.integration


def test_health_relaunches_a_killed_driver_and_nothing_is_lost_or_applied_twice(
    pipeline_config: RelayConfig,
) -> None:
    cfg = pipeline_config
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 1000, None, partitions=cfg.partitions)
    first = deploy(cfg, version="v1", wait_s=300)
    inst_id, old = first["instance_id"], first["submission_id"]
    checkpoint = ledger.instance(inst_id).checkpoint_dir
    old_attempt = next(a for a in ledger.attempts(inst_id) if a.state is AttemptState.RUNNING)
    producer = threading.Thread(
        target=produce,
        args=(cfg.kafka_bootstrap, cfg.topic, 3000, 100.0),
        kwargs={"partitions": cfg.partitions},
    )
    producer.start()
    try:
        assert spark_client(cfg).kill(old), "the master accepted the kill"
        wait_for(
            "the master to end the driver as KILLED",
            lambda: spark_client(cfg).driver_status(old) is DriverState.KILLED,
            timeout=60,
        )
        assert ledger.instance(inst_id).state is InstanceState.ACTIVE  # the ledger still says it runs

        reports = []

        def healed() -> bool:
            reports.append(run_health(cfg, ledger, heal=True))
            return ledger.instance(inst_id).submission_id != old

        # The first checks may wait (the killed attempt's last heartbeat is fresh): each says why.
        wait_for("the health check to relaunch the instance", healed, timeout=120, interval=2)
        check = reports[-1].check("self_heal")
        assert check.level is Level.WARN and "relaunched as" in check.message, check
        assert all(r.check("self_heal").level is Level.WARN for r in reports), [r.summary() for r in reports]
        inst = ledger.instance(inst_id)
        assert inst.state is InstanceState.ACTIVE and inst.checkpoint_dir == checkpoint
        assert driver_running(cfg, inst.submission_id)
        heal_rows = ledger.reports(cfg.pipeline, REPORT_KIND, 10)
        assert [r["body"]["relaunched"] for r in heal_rows] == [True]
        assert heal_rows[0]["body"]["driver_state"] == DriverState.KILLED.value
        assert ledger.attempt(old_attempt.id).state is AttemptState.CRASHED
    finally:
        producer.join()
    wait_for("the relaunched driver to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    # The next check finds it running: nothing more to heal, no second relaunch.
    after = run_health(cfg, ledger, heal=True)
    assert "self_heal" not in [c.name for c in after.checks]
    assert len(ledger.reports(cfg.pipeline, REPORT_KIND, 10)) == 1

    result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True], result
    report = audit(cfg, ledger)
    assert report.ok, report.to_json()
    assert report.message_count == 4000 and sum(p.applied_once for p in report.partitions) == 4000
    ledger.close()
