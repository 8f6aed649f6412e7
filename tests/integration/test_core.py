"""Issue 2 acceptance on real parts: noida-db, a Spark standalone cluster, SQLite and PostgreSQL ledgers."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from relay.audit import audit, render
from relay.config import RelayConfig
from relay.errors import OperationError
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.models import AttemptState, InstanceState
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.stop import stop
from relay.protocol import checkpoint
from relay.spark.launcher import driver_running, launch, spark_client
from relay.spark.rest import DriverState

from tests.conftest import wait_for
from tests.counter_batches import counted
from tests.integration.helpers import caught_up, python_driver_pid, wait_relaunched

pytestmark = pytest.mark.integration


def test_kills_stop_restart_poison_and_data_loss_on_the_cluster(pipeline_config: RelayConfig) -> None:
    cfg = pipeline_config
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 2000, None, poison=5, partitions=cfg.partitions)
    first = deploy(cfg, version="v1", wait_s=240)
    inst_id = first["instance_id"]

    # 20,000 messages in all, produced while the driver is SIGKILLed mid-backlog (more kills, at
    # random moments: the short chaos run; a kill between the tasks' writes and the commit:
    # test_crash_points and test_user_pipeline_dags).
    producer = threading.Thread(
        target=produce,
        args=(cfg.kafka_bootstrap, cfg.topic, 18000, 600.0),
        kwargs={"partitions": cfg.partitions},
    )
    producer.start()
    try:
        attempt_id, pid = python_driver_pid(ledger, inst_id)
        batches_before = len(ledger.recent_batches(cfg.pipeline, 1000, inst_id))
        wait_for(
            "batches before the kill",
            lambda: len(ledger.recent_batches(cfg.pipeline, 1000, inst_id)) >= batches_before + 2,
            timeout=120,
        )
        os.kill(pid, signal.SIGKILL)
        wait_relaunched(ledger, inst_id, attempt_id, timeout=180)
    finally:
        producer.join()
    wait_for("the job to catch up", lambda: caught_up(cfg, ledger), timeout=300, interval=1)
    report = audit(cfg, ledger)
    assert report.ok, report.to_json()
    assert sum(p.applied_once for p in report.partitions) == 20005
    assert report.message_count == 20000 and sum(p.dead_letters for p in report.partitions) == 5
    assert len(ledger.attempts(inst_id)) >= 2

    # Graceful stop: between batches, offsets == commits, nothing of the pipeline left in the master.
    result = stop(cfg, timeout_s=120)
    assert [s["graceful"] for s in result["stopped"]] == [True]
    ckpt = checkpoint.inspect(ledger.instance(inst_id).checkpoint_dir)
    assert ckpt.last_batch is not None and ckpt.last_batch == ckpt.last_commit
    assert master_apps(cfg, cfg.pipeline) == []
    assert spark_client(cfg).driver_status(first["submission_id"]) is DriverState.FINISHED

    # A restart applies nothing twice and continues.
    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    second = deploy(cfg, version="v1", wait_s=240)
    wait_for("the restart to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 20300, report.to_json()
    # relay audit --deep as a person runs it after make run: in a shell without the ledger's URL in
    # the environment (each driver has it; the counter's sink reads it there), reading the sink.
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RELAY_LEDGER_URL", raising=False)
        deep = audit(cfg, ledger, deep=True, sink=True)
    assert deep.ok and deep.sink is not None and deep.sink.kind == "counter", render(deep.to_json())

    # A fenced instance's driver exits on purpose (0) and the master's supervision does not relaunch it.
    ledger.fence(second["instance_id"], "test: fenced by an operator")
    wait_for(
        "the fenced driver to finish",
        lambda: spark_client(cfg).driver_status(second["submission_id"]) is DriverState.FINISHED,
        timeout=120,
    )
    fenced_attempts = ledger.attempts(second["instance_id"])
    assert [a.state for a in fenced_attempts] == [AttemptState.FENCED]
    assert master_apps(cfg, cfg.pipeline) == []

    # Retention took records behind the cursor: the restart fails fast, writes nothing, is not relaunched.
    produce(cfg.kafka_bootstrap, cfg.topic, 300, None, partitions=cfg.partitions)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        latest = kafka.latest(cfg.topic)
        kafka.delete_records(cfg.topic, {0: latest[0]})
    cursor0 = min(
        le.next_offset for le in ledger.pipeline_leases(cfg.pipeline) if le.partition == 0 and not le.drained
    )
    with pytest.raises(OperationError) as err:
        deploy(cfg, version="v1", wait_s=240)
    message = str(err.value)
    assert f"data loss on {cfg.topic}[0]" in message
    assert f"needed offset {cursor0}" in message and f"earliest available is {latest[0]}" in message
    assert f"{latest[0] - cursor0} record(s) are gone" in message
    assert counted(ledger, cfg.pipeline) == 20300
    failed = ledger.instances(cfg.pipeline)[-1]
    assert failed.state is InstanceState.FAILED and failed.id != second["instance_id"]
    wait_for(
        "the failed driver to finish",
        lambda: spark_client(cfg).driver_status(failed.submission_id) is DriverState.FINISHED,
        timeout=60,
    )
    assert len(ledger.attempts(failed.id)) == 1  # not relaunched


@pytest.mark.slow  # make test-long: fencing is proven by test_binding, test_attempt_binding, the model
def test_second_attempt_fences_the_first_and_stop_is_clean_in_local_mode(
    pipeline_config: RelayConfig,
) -> None:
    cfg = pipeline_config
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 3000, None, partitions=cfg.partitions)
    info = deploy(cfg, version="v1", local=True, wait_s=240)
    inst = ledger.instance(info["instance_id"])
    first_attempt = ledger.attempts(inst.id)[-1]
    wait_for("the backlog to be applied", lambda: caught_up(cfg, ledger), timeout=180, interval=1)

    second = launch(cfg, ledger, inst, local=True)  # a second driver of the same instance
    wait_for("the second attempt", lambda: len(ledger.attempts(inst.id)) == 2, timeout=120)
    producer = threading.Thread(
        target=produce,
        args=(cfg.kafka_bootstrap, cfg.topic, 2000, 400.0),
        kwargs={"partitions": cfg.partitions},
    )
    producer.start()
    wait_for(
        "the first attempt to be fenced",
        lambda: ledger.attempt(first_attempt.id).state is AttemptState.FENCED,
        timeout=120,
    )
    wait_for("the first driver to exit", lambda: not driver_running(cfg, info["submission_id"]), timeout=60)
    producer.join()
    wait_for("the second attempt to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger)
    assert report.ok and report.message_count == 5000, report.to_json()

    stop(cfg, local=True)
    assert not driver_running(cfg, second)
    ckpt = checkpoint.inspect(inst.checkpoint_dir)
    assert ckpt.last_batch == ckpt.last_commit
    assert ledger.attempts(inst.id)[-1].state is AttemptState.STOPPED


def test_driver_with_bad_arguments_is_not_relaunched(stack: RelayConfig) -> None:
    from relay.spark.driver_properties import driver_environment, driver_properties

    client = spark_client(stack)
    job = str(stack.data_dir.parent.parent.parent / "spark_jobs" / "pipeline_driver.py")
    props = driver_properties(stack, "relay-badargs-1", supervise=True, py_files=[])
    before = client.master_state()
    apps_before = {a.id for a in [*before.active_apps, *before.completed_apps]}
    sub = client.submit_python(
        job, ["--instance-id", "not-a-number", "--supervised"], props, driver_environment(stack)
    )
    wait_for("the driver to finish", lambda: client.driver_status(sub).is_final, timeout=120)
    assert client.driver_status(sub) is DriverState.FINISHED
    state = client.master_state()
    new_apps = [a.name for a in [*state.active_apps, *state.completed_apps] if a.id not in apps_before]
    assert new_apps == [], "the driver refused its arguments before it started a Spark application"
