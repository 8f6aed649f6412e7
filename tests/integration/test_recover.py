"""Issue 5 acceptance: the seeds' retention scenario on the real broker, recovered knowingly."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from relay.audit import audit
from relay.config import RelayConfig
from relay.errors import OperationError, OperationInProgressError
from relay.kafka.offsets import KafkaOffsets
from relay.kafka.producer import produce
from relay.ledger.store import Ledger
from relay.operations.deploy import deploy
from relay.operations.recover import recover
from relay.operations.status import offsets_view
from relay.operations.stop import stop
from relay.operations.upgrade import ALL_TERMINAL
from relay.sinks.ledger_messages import LedgerMessagesSink
from relay_dev.airflow_local import ensure_airflow_db

from tests.conftest import wait_for
from tests.counter_batches import counted
from tests.integration.helpers import caught_up, dag_test

# make test-long: `make test` recovers through relay_recover (test_user_pipeline_dags), a stateful
# pipeline (test_user_path_stateful) and from every crash point (test_crash_points); the fail-fast
# data-loss message is asserted by test_core.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture()
def cfg(stack: RelayConfig) -> RelayConfig:
    name = f"r{uuid.uuid4().hex[:8]}"
    return stack.with_(pipeline=name, topic=name, ledger_url=f"sqlite:///{stack.data_dir / (name + '.db')}")


def ledger_snapshot(ledger: Ledger, pipeline: str) -> tuple:
    return (
        [lease.to_json() for lease in ledger.pipeline_leases(pipeline)],
        [g.to_json() for g in ledger.gaps(pipeline)],
        [i.to_json() for i in ledger.instances(pipeline)],
        counted(ledger, pipeline),
    )


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_retention_scenario_fails_fast_then_recovers_with_declared_gaps(cfg: RelayConfig) -> None:
    ledger = Ledger(cfg.ledger_url, create=True)
    produce(cfg.kafka_bootstrap, cfg.topic, 600, None, partitions=cfg.partitions)
    deploy(cfg, wait_s=240)
    wait_for("the job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    stop(cfg)

    # While the job is stopped, more arrives and retention deletes part of it on partition 0.
    produce(cfg.kafka_bootstrap, cfg.topic, 400, None, partitions=cfg.partitions)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        latest = kafka.latest(cfg.topic)
        kafka.delete_records(cfg.topic, {0: latest[0] - 20})
    cursor0 = next(r["cursor"] for r in offsets_view(cfg, ledger) if r["partition"] == 0)
    lost = latest[0] - 20 - cursor0
    assert lost > 0
    with pytest.raises(OperationError, match=rf"data loss on {cfg.topic}\[0\]: needed offset {cursor0}"):
        deploy(cfg, wait_s=240)
    assert next(r for r in offsets_view(cfg, ledger) if r["partition"] == 0)["invalidated"]

    # Dry run (the DAG's default): a plan in the task log and its result, and nothing changes.
    before, ckpts = ledger_snapshot(ledger, cfg.pipeline), tree(cfg.checkpoints_dir)
    planned = recover(cfg, strategy="earliest")
    assert planned["dry_run"] is True
    p0 = next(p for p in planned["plan"]["partitions"] if p["partition"] == 0)
    assert (p0["cursor"], p0["target"], p0["lost"], p0["skipped"]) == (cursor0, latest[0] - 20, lost, 0)
    assert planned["plan"]["total_lost"] == lost
    ensure_airflow_db(cfg)
    run = dag_test(cfg, "relay_recover", {"strategy": "earliest"})
    assert run.state == "success" and f"{lost} record(s) declared lost" in run.output, run.output[-4000:]
    assert run.tasks == {
        "plan": "success",
        "approve": "skipped",  # a dry run asks nobody and ends after the plan
        "open_recovery": "skipped",
        "stop": "skipped",
        "verify_none_runs": "skipped",
        "execute": "skipped",
        "wait_first_commit": "skipped",
        "audit": "skipped",
    }
    assert ledger_snapshot(ledger, cfg.pipeline) == before and tree(cfg.checkpoints_dir) == ckpts

    # Execute through the DAG, approved by the caller (a person's approval is tested in a running
    # Airflow: test_airflow_dags): archived checkpoints, gaps recorded, a fresh instance resumes.
    conf = {"strategy": "earliest", "dry_run": False, "pre_approved": True, "reason": "retention test"}
    run = dag_test(cfg, "relay_recover", conf)
    assert run.state == "success", run.output[-4000:]
    assert set(run.tasks.values()) == {"success"}, run.tasks
    assert "pre-approved by the trigger" in run.output
    done = ledger.operations(cfg.pipeline, "recovery", 1)[0]
    assert done["state"] == "EXECUTED"
    assert [(e["uri"], e["extra"]) for e in run.asset_events] == [
        (
            LedgerMessagesSink(cfg.ledger_url).dataset().uri,  # the counter's: its ledger's database
            {
                "pipeline": cfg.pipeline,
                "version": "v1",
                "instance": done["data"]["instance_id"],
                "operation": "recovery",
            },
        )
    ]
    archived = done["data"]["archived_checkpoints"]
    assert archived and all(Path(p).exists() for p in archived)
    wait_for("the recovered job to catch up", lambda: caught_up(cfg, ledger), timeout=180, interval=1)
    report = audit(cfg, ledger)
    assert report.ok, report.to_json()
    assert [p.declared_lost for p in report.partitions] == [lost, 0, 0]
    assert report.message_count == 1000 - lost
    gaps = ledger.gaps(cfg.pipeline)
    assert [(g.partition, g.start_offset, g.end_offset, g.kind) for g in gaps] == [
        (0, cursor0, latest[0] - 20, "lost")
    ]
    assert "retention test" in gaps[0].reason

    # Strategy timestamp: the first offset at or after the time, as the broker's own lookup says.
    produce(cfg.kafka_bootstrap, cfg.topic, 60, None, partitions=cfg.partitions)
    wait_for("the new messages to be applied", lambda: caught_up(cfg, ledger), timeout=120, interval=1)
    mark = int(time.time() * 1000) + 1
    wait_for("the clock to pass the mark", lambda: time.time() * 1000 > mark + 5, timeout=5, interval=0.01)
    produce(cfg.kafka_bootstrap, cfg.topic, 90, None, partitions=cfg.partitions)
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        by_time = kafka.offsets_for_time(cfg.topic, mark)
    plan = recover(cfg, strategy="timestamp", timestamp_ms=mark, allow_reprocess=True)["plan"]
    expected = {
        pp["partition"]: by_time[pp["partition"]]
        if by_time.get(pp["partition"]) is not None
        else pp["latest"]
        for pp in plan["partitions"]
    }
    assert {pp["partition"]: pp["target"] for pp in plan["partitions"]} == expected
    # The job runs on: what it applied of the 90 before the plan read its cursors is applied again,
    # never skipped (the mark precedes all 90, so every target is at or below its cursor).
    assert plan["total_skipped"] == 0
    reapplied = sum(max(pp["cursor"] - pp["target"], 0) for pp in plan["partitions"])
    assert plan["total_reprocess"] == reapplied <= 90

    # A recovery while an upgrade is in progress is refused.
    op = ledger.open_operation(cfg.pipeline, "upgrade", "GREEN_STARTING", {"version": "v9"}, {}, ALL_TERMINAL)
    with pytest.raises(OperationInProgressError, match="upgrade"):
        recover(cfg, strategy="latest", dry_run=False)
    ledger.move_operation(op["id"], "ABORTED", error="test cleanup")
    stop(cfg)
