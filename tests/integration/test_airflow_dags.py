"""The DAGs against the real embedded stack: dag.test() of relay_deploy / relay_stop (their tasks, the
asset event), relay_recover's approval in a running Airflow (Reject, Approve, the deferred wait), and
one trigger through a running Airflow's REST API.

``dag.test()`` runs in a subprocess with :func:`relay_dev.airflow_local.airflow_env`: Airflow's settings
are process-global (read at import), the subprocess gets the stack's AIRFLOW_HOME and connections, and
pytest's own logging stays untouched. The run's state is asserted (``dag.test()`` does not raise).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from airflow_client.client import AssetEventResponse, HITLDetail, UpdateHITLDetailPayload
from relay.config import PROJECT_ROOT, RelayConfig
from relay.errors import StackError
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.inventory import master_apps
from relay.operations.stop import stop
from relay.sinks.ledger_messages import LedgerMessagesSink
from relay_dev.airflow_local import (
    AirflowApi,
    ApiAnswer,
    LocalAirflow,
    Unanswered,
    airflow_env,
    ensure_airflow_db,
    program_name,
    trigger_dag_rest,
    wait_dag_run,
)
from relay_dev.stack import session_pids

from tests.conftest import free_port, wait_for
from tests.counter_batches import counted
from tests.integration.helpers import caught_up, dag_test

pytestmark = pytest.mark.integration


def _private(stack: RelayConfig, name: str) -> RelayConfig:
    """A pipeline and topic of this test only, so other tests sharing the stack are not disturbed."""
    suffix = uuid.uuid4().hex[:6]
    config = stack.with_(pipeline=f"{name}{suffix}", topic=f"{name}-{suffix}")
    produce(config.kafka_bootstrap, config.topic, 200, None, partitions=config.partitions)
    return config


@pytest.fixture
def dags_config(stack: RelayConfig) -> Iterator[RelayConfig]:
    config = _private(stack, "afdags")
    ensure_airflow_db(config)
    yield config
    if master_apps(config, config.pipeline):  # a failed assertion must not leave a driver running
        stop(config, timeout_s=30)


@pytest.mark.slow  # make test-long (~75 s); test_user_pipeline_dags.py runs relay_deploy/relay_stop
def test_deploy_then_refuse_a_second_deploy_then_stop(dags_config: RelayConfig) -> None:
    config = dags_config
    ledger = Ledger(config.ledger_url, create=True)

    run = dag_test(config, "relay_deploy", {"version": "v1", "wait_seconds": 240})
    assert run.state == "success", run.output[-4000:]
    assert run.tasks == {
        "submit": "success",
        "wait_first_commit": "success",
        "verify_single_instance": "success",
    }
    instances = ledger.instances(config.pipeline)
    assert len(instances) == 1 and instances[0].state.value == "ACTIVE"
    assert [a.name for a in master_apps(config, config.pipeline)] == [instances[0].app_name]
    # "the counter's table is now written by v1": one asset event, on what the pipeline writes (the
    # counter on the stack's SQLite ledger: its database file), a downstream DAG can be scheduled on.
    assert run.asset_events == [
        {
            "uri": LedgerMessagesSink(config.ledger_url).dataset().uri,
            "task_id": "verify_single_instance",
            "extra": {
                "pipeline": config.pipeline,
                "version": "v1",
                "instance": instances[0].id,
                "operation": "deploy",
            },
        }
    ]

    run = dag_test(config, "relay_deploy", {"version": "v2", "wait_seconds": 60})
    assert run.state == "failed"
    assert "already running" in run.output
    assert run.tasks["submit"] == "failed" and run.tasks["wait_first_commit"] == "upstream_failed"
    assert len(ledger.instances(config.pipeline)) == 1, "the refused deploy created an instance"
    assert [a.name for a in master_apps(config, config.pipeline)] == [instances[0].app_name]
    assert run.asset_events == []

    run = dag_test(config, "relay_stop", {"timeout_seconds": 60})
    assert run.state == "success", run.output[-4000:]
    assert run.tasks == {"stop": "success", "verify_none_runs": "success"}
    assert master_apps(config, config.pipeline) == []
    assert ledger.instances(config.pipeline, live_only=True) == []
    assert ledger.instance(instances[0].id).state.value == "STOPPED"  # between batches, not killed


class RunApi(AirflowApi):
    """What a person (or an automated caller) reads and answers on a run, through the REST API."""

    def task_state(self, dag_id: str, run_id: str, task_id: str) -> str | None:
        """The task's state; None while the api-server does not answer (a busy SQLite metadata DB)."""
        try:
            ti = self.call(self.task_instances.get_task_instance, dag_id, run_id, task_id)
        except Unanswered:
            return None
        except ApiAnswer as exc:
            if exc.status < 500:
                raise
            return None
        return ti.state.value if ti.state else None

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str) -> HITLDetail:
        return self.call(self.task_instances.get_hitl_detail, dag_id, run_id, task_id, -1)

    def answer(self, dag_id: str, run_id: str, task_id: str, option: str) -> None:
        body = UpdateHITLDetailPayload(chosen_options=[option], params_input={})
        self.call(self.task_instances.update_hitl_detail, dag_id, run_id, task_id, -1, body)

    def scheduler_log(self) -> list[str]:
        path = self.config.logs_dir / f"{program_name('scheduler')}.log"
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def park_taken_in(self, dag_id: str, run_id: str, task_id: str) -> bool:
        """Whether the scheduler has taken in the executor's report of the worker that parked the task.

        Answer only then. Parking ends that worker with an executor event "success" for the task's
        key; the resumed attempt has the same key (same try). Airflow 3.3.2's scheduler ignores that
        stale event only while the resumed task is ``scheduled`` (scheduler_job_runner.py:1476-1494):
        an answer given before the scheduler's next loop gets the task queued and dispatched in that
        loop, then the stale event read, and the task failed as "killed externally" (apache/airflow
        #67287 queued, #72716 running). A person answers seconds later; this test answers at once.
        """
        finished = f"TaskInstance Finished: dag_id={dag_id}, task_id={task_id}, run_id={run_id},"
        return any(finished in line and "state=awaiting_input," in line for line in self.scheduler_log())

    def explain(self, dag_id: str, run_id: str, limit: int = 6000) -> str:
        """Each task's state and the log of the failed ones, and the scheduler's errors about the run."""
        lines = [super().explain(dag_id, run_id, limit)]
        # A task failed by the scheduler (not by itself) is named in the scheduler's log only.
        lines += [line[:600] for line in self.scheduler_log() if run_id in line and "[error" in line]
        return "\n".join(lines)

    def asset_events(self, dag_id: str, run_id: str) -> list[AssetEventResponse]:
        found = self.call(self.assets.get_asset_events, source_dag_id=dag_id, source_run_id=run_id)
        return list(found.asset_events)


def _ledger_state(ledger: Ledger, pipeline: str) -> tuple:
    return (
        [lease.to_json() for lease in ledger.pipeline_leases(pipeline)],
        [g.to_json() for g in ledger.gaps(pipeline)],
        [i.to_json() for i in ledger.instances(pipeline)],
        ledger.operations(pipeline),
        counted(ledger, pipeline),
    )


@pytest.mark.slow  # make test-long: 6-8 min under load (deploy, a running Airflow, a recovery)
def test_recovery_waits_for_a_person_reject_changes_nothing_approve_recovers_deferred(
    stack: RelayConfig,
) -> None:
    """relay_recover in a running Airflow: the plan is shown for approval; Reject leaves the ledger
    as it was; Approve recovers, the first-commit wait is deferred, the asset event is recorded."""
    config = _private(stack, "afhitl")
    config = config.with_(ports=replace(config.ports, airflow=free_port()))
    ledger = Ledger(config.ledger_url, create=True)
    deploy(config, version="v1", wait_s=240)
    wait_for("the job to catch up", lambda: caught_up(config, ledger), timeout=180, interval=1)
    stop(config)
    produce(config.kafka_bootstrap, config.topic, 100, None, partitions=config.partitions)
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        cursor = min(le.next_offset for le in ledger.pipeline_leases(config.pipeline) if le.partition == 0)
        kafka.delete_records(config.topic, {0: cursor + 20})  # retention takes 20 unread records
    before = _ledger_state(ledger, config.pipeline)
    dag_id, conf = "relay_recover", {"dry_run": False, "reason": "approval test"}

    airflow = LocalAirflow(config, health_timeout_s=420)  # 2 shared cores: the api-server may be slow
    airflow.start()
    try:
        api = RunApi(config, timeout_s=60)

        def awaiting_approval(run_id: str) -> bool:
            return api.task_state(dag_id, run_id, "approve") == "awaiting_input"

        # Rejected: the later tasks are skipped, nothing in the ledger or on disk changed.
        run_id = trigger_dag_rest(config, dag_id, conf).dag_run_id
        wait_for("the approval to be asked", lambda: awaiting_approval(run_id), timeout=300, interval=0.5)
        detail = api.hitl_detail(dag_id, run_id, "approve")
        assert detail.options == ["Approve", "Reject"]
        assert "**20 record(s) will be declared lost**" in (detail.body or ""), detail.body
        assert f"| 0 | {cursor} | {cursor + 20} |" in (detail.body or ""), detail.body
        wait_for("the parked worker's end", lambda: api.park_taken_in(dag_id, run_id, "approve"), timeout=120)
        api.answer(dag_id, run_id, "approve", "Reject")
        rejected = wait_dag_run(config, dag_id, run_id, timeout=300)
        assert rejected.state.value == "success", api.explain(dag_id, run_id)
        assert [
            api.task_state(dag_id, run_id, t)
            for t in ("approve", "open_recovery", "stop", "verify_none_runs", "execute", "wait_first_commit")
        ] == ["skipped"] * 6
        assert _ledger_state(ledger, config.pipeline) == before
        assert api.asset_events(dag_id, run_id) == []

        # Approved: executed; the wait for the new instance's first commit holds no worker.
        run_id = trigger_dag_rest(config, dag_id, conf).dag_run_id
        wait_for("the approval to be asked", lambda: awaiting_approval(run_id), timeout=300, interval=0.5)
        wait_for("the parked worker's end", lambda: api.park_taken_in(dag_id, run_id, "approve"), timeout=120)
        api.answer(dag_id, run_id, "approve", "Approve")
        seen: set[str | None] = set()

        def deferred_or_over() -> bool:
            seen.add(api.task_state(dag_id, run_id, "wait_first_commit"))
            return bool(seen & {"deferred", "success", "failed", "upstream_failed"})

        wait_for("the first-commit wait to start", deferred_or_over, timeout=300, interval=0.3)
        assert "deferred" in seen, (seen, api.explain(dag_id, run_id))
        approved = wait_dag_run(config, dag_id, run_id, timeout=400)
        assert approved.state.value == "success", api.explain(dag_id, run_id)
        op = ledger.operations(config.pipeline, "recovery", 1)[0]
        assert op["state"] == "EXECUTED"
        lost = [
            (g.partition, g.start_offset, g.end_offset)
            for g in ledger.gaps(config.pipeline)
            if g.kind == "lost"
        ]
        assert lost == [(0, cursor, cursor + 20)]
        events = api.asset_events(dag_id, run_id)
        assert [(e.uri, e.source_task_id, e.extra) for e in events] == [
            (
                LedgerMessagesSink(config.ledger_url).dataset().uri,
                "audit",
                {
                    "pipeline": config.pipeline,
                    "version": "v1",
                    "instance": op["data"]["instance_id"],
                    "operation": "recovery",
                },
            )
        ]
    finally:
        try:
            if master_apps(config, config.pipeline):
                stop(config, timeout_s=30)
        finally:
            airflow.stop()


@pytest.mark.slow  # make test-long (make run triggers relay_deploy through REST too)
def test_local_airflow_runs_relay_deploy_triggered_through_rest(stack: RelayConfig) -> None:
    config = _private(stack, "afrest")
    config = config.with_(ports=replace(config.ports, airflow=free_port()))
    airflow = LocalAirflow(config)
    started = airflow.start()
    pids = [c["pid"] for c in started["components"]]
    try:
        assert started["healthy"], started
        with pytest.raises(StackError, match="400"):  # Param validation at trigger time
            trigger_dag_rest(config, "relay_deploy", {"starting": "middle"})
        run = trigger_dag_rest(config, "relay_deploy", {"version": "v1", "wait_seconds": 240})
        done = wait_dag_run(config, "relay_deploy", run.dag_run_id, timeout=400)
        assert done.state.value == "success", AirflowApi(config).explain("relay_deploy", run.dag_run_id)
        assert len(master_apps(config, config.pipeline)) == 1

        run = trigger_dag_rest(config, "relay_stop", {"timeout_seconds": 60})
        done = wait_dag_run(config, "relay_stop", run.dag_run_id, timeout=300)
        assert done.state.value == "success", AirflowApi(config).explain("relay_stop", run.dag_run_id)
        assert master_apps(config, config.pipeline) == []
    finally:
        try:
            if master_apps(config, config.pipeline):
                stop(config, timeout_s=30)
        finally:
            airflow.stop()
    assert all(session_pids(pid) == [] for pid in pids)


@pytest.mark.slow  # make test-long
def test_provider_submit_hook_starts_a_cluster_driver(
    stack: RelayConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alternative launcher path (SparkSubmitHook + PythonRunner + a carrier jar) really runs the job."""
    from relay.ledger.models import Color
    from relay.operations.deploy import create_instance
    from relay.spark.first_commit import wait_until_active

    for key, value in airflow_env(stack).items():  # connections, incl. relay_spark_submit
        if key.startswith("AIRFLOW") or key == "PATH":  # PATH: the hook finds spark-submit in the venv
            monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "plugins"))
    from relay_airflow.provider_submit import submit_with_provider

    config = _private(stack, "afprov")
    ledger = Ledger(config.ledger_url, create=True)
    inst, _ = create_instance(config, ledger, "v1", Color.BLUE)
    try:
        driver = submit_with_provider(config, ledger, inst)
        assert driver.startswith("driver-")
        assert ledger.instance(inst.id).submission_id == driver
        assert wait_until_active(config, ledger, inst.id, 240).state == "ACTIVE"
    finally:
        stop(config, timeout_s=30)
    assert master_apps(config, config.pipeline) == []
