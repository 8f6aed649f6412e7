"""Attempts are bound to the submission Relay made: copies are refused, relaunches are followed.

Each scenario was a defect on the landed main: a copy of the driver JSON fenced the real driver and
became the writer; a driver refused at start exited 1 and was relaunched forever; after a worker
loss Relay kept the dead driver id and `relay stop` fenced a pipeline that had stopped gracefully.
"""

from __future__ import annotations

import os
import signal

import pytest
from relay.audit import audit
from relay.config import RelayConfig
from relay.health import Level, run_health
from relay.kafka.producer import produce
from relay.ledger.models import AttemptState, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.stop import stop
from relay.sinks import ledger_messages_tables as counter_tables
from relay.spark.launcher import launch, spark_client
from relay.spark.rest import DriverState
from relay_dev.stack import LocalStack, Part, pid_alive
from sqlalchemy import func, select

from tests.conftest import wait_for
from tests.integration.helpers import caught_up, submit_copy

pytestmark = pytest.mark.integration


def writers(ledger: Ledger, pipeline: str) -> dict[int, int]:
    """Rows written per instance: a copy that slipped through would show up here."""
    m = counter_tables.messages
    with ledger.tx() as conn:
        rows = conn.execute(
            select(m.c.instance_id, func.count()).where(m.c.pipeline == pipeline).group_by(m.c.instance_id)
        ).all()
    return {int(i): int(n) for i, n in rows}


def finished(cfg: RelayConfig, driver_id: str) -> bool:
    return spark_client(cfg).driver_status(driver_id) is DriverState.FINISHED


def test_copy_of_the_driver_is_refused_never_writes_and_stop_stays_graceful(
    pipeline_config: RelayConfig,
) -> None:
    cfg = pipeline_config
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 500, None, partitions=cfg.partitions)
    first = deploy(cfg, version="v1", wait_s=240)
    inst_id = first["instance_id"]
    epoch = ledger.instance(inst_id).current_epoch

    # Copies of the real job (they would write: same code, same ledger): without a token, with a
    # wrong one, and a replay of the submission with a valid token while the real driver runs.
    valid = ledger.issue_launch_token(inst_id)  # as if the submission JSON had been captured
    copies = [
        submit_copy(cfg, ledger, inst_id, None),
        submit_copy(cfg, ledger, inst_id, "stolen?"),
        submit_copy(cfg, ledger, inst_id, valid),
    ]
    wait_for("the copies to be refused", lambda: len(ledger.refusals(cfg.pipeline)) == 3, timeout=240)
    for copy in copies:
        wait_for(f"copy {copy} to exit 0", lambda c=copy: finished(cfg, c), timeout=120)
    refused = ledger.refusals(cfg.pipeline)
    assert sorted(r["driver_id"] for r in refused) == sorted(copies)
    reasons = " | ".join(r["reason"] for r in refused)
    assert "no launch token" in reasons and "does not match" in reasons and "is alive" in reasons

    inst = ledger.instance(inst_id)
    assert inst.current_epoch == epoch and inst.state is InstanceState.ACTIVE
    assert inst.submission_id == first["submission_id"]
    assert [a.state for a in ledger.attempts(inst_id)] == [AttemptState.RUNNING]

    single = run_health(cfg, ledger, persist=False).check("single_instance")
    assert single.level is Level.WARN, single.to_json()
    assert sorted(r["driver"] for r in single.data["refused_starts"]) == sorted(copies)

    # The real driver keeps applying, alone.
    produce(cfg.kafka_bootstrap, cfg.topic, 500, None, partitions=cfg.partitions)
    wait_for("the job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 1000, report.to_json()
    assert writers(ledger, cfg.pipeline) == {inst_id: 1000}

    result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True]
    assert ledger.instance(inst_id).state is InstanceState.STOPPED

    # A driver of a stopped instance, even with the right token, is refused at start and exits 0:
    # the master's supervision does not relaunch it (it used to exit 1, forever).
    sub = launch(cfg, ledger, ledger.instance(inst_id))
    wait_for("the refused driver to exit 0", lambda: finished(cfg, sub), timeout=180)
    assert [a.state for a in ledger.attempts(inst_id)] == [AttemptState.STOPPED]
    assert ledger.instance(inst_id).state is InstanceState.STOPPED


@pytest.mark.slow  # make test-long (the suite stays near 30 min)
@pytest.mark.parametrize("backend", ["sqlite"])  # about Spark, not the ledger: one backend is enough
def test_after_a_worker_loss_relay_follows_the_relaunched_driver_and_stops_it_gracefully(
    stack: RelayConfig, pipeline_config: RelayConfig
) -> None:
    cfg = pipeline_config
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 500, None, partitions=cfg.partitions)
    first = deploy(cfg, version="v1", wait_s=240)
    inst_id = first["instance_id"]
    local = LocalStack(stack)
    worker_pid = local.pid(Part.SPARK_WORKER)
    assert worker_pid
    try:
        os.killpg(worker_pid, signal.SIGKILL)  # the worker host is gone: worker JVM and its drivers
        wait_for("the worker to be dead", lambda: not pid_alive(worker_pid), timeout=30)
    finally:
        local.up()  # supervisord restarted the worker already: up only waits until it is healthy
    wait_for(
        "a new attempt under a new driver id",
        lambda: any(
            a.state is AttemptState.RUNNING and a.driver_id not in (None, first["submission_id"])
            for a in ledger.attempts(inst_id)
        ),
        timeout=240,
    )
    current = [a for a in ledger.attempts(inst_id) if a.state is AttemptState.RUNNING]
    assert len(current) == 1
    assert ledger.instance(inst_id).submission_id == current[0].driver_id != first["submission_id"]

    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    wait_for("the job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True], result
    assert result["stopped"][0]["seconds"] < 60
    assert ledger.instance(inst_id).state is InstanceState.STOPPED
    assert finished(cfg, current[0].driver_id)
    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 800, report.to_json()
