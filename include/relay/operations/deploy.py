"""Deploy: start the pipeline if nothing of it runs, from the ledger's safe point."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import select

from relay.config import RelayConfig
from relay.errors import ConfigError, OperationError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger import schema as s
from relay.ledger.models import Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.operations.inventory import no_room, take_inventory
from relay.spark.capacity import HOW_TO_MAKE_ROOM
from relay.spark.first_commit import wait_until_active
from relay.spark.launcher import app_name, launch

Progress = Callable[[str], None]
STARTING_POSITIONS = ("earliest", "latest")


def _noop(_: str) -> None:
    pass


def create_instance(
    config: RelayConfig,
    ledger: Ledger,
    version: str,
    color: Color,
    starting: str = "earliest",
    require_no_live: bool = True,
) -> tuple[Instance, list[dict]]:
    """Create an instance holding every unfinished range of the pipeline (or the starting position).

    One transaction, which also re-checks that no other instance is live (two deploys racing start one).
    """
    if starting not in STARTING_POSITIONS:
        raise ConfigError(f"starting position must be one of {STARTING_POSITIONS}, got {starting!r}")
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        kafka.ensure_topic(config.topic, config.partitions)
        initial = kafka.earliest(config.topic) if starting == "earliest" else kafka.latest(config.topic)
    with ledger.tx() as conn:
        ledger.ensure_pipeline(config.pipeline, conn)
        conn.execute(s.pipelines.select().where(s.pipelines.c.name == config.pipeline).with_for_update())
        live = ledger.instances(config.pipeline, live_only=True, conn=conn)
        if require_no_live and live:
            raise OperationError(f"pipeline {config.pipeline} is already running: instance {live[0].id}")
        inst = ledger.create_instance(conn, config.pipeline, version, color, "", "")
        ckpt = config.checkpoints_dir / f"instance-{inst.id}"
        ledger.set_instance(
            inst.id, conn, checkpoint_dir=str(ckpt), app_name=app_name(config.pipeline, inst.id)
        )
        first_start = not ledger.pipeline_leases(config.pipeline, conn)
        taken = ledger.take_over(conn, config.pipeline, inst)
        if first_start:
            for partition, offset in sorted(initial.items()):
                taken.append(ledger.open_lease(conn, inst, config.topic, partition, offset))
        inst = ledger.instance(inst.id, conn)
    return inst, [lease.to_json() for lease in taken]


def launch_or_fail(
    config: RelayConfig, ledger: Ledger, inst: Instance, local: bool, extra_args: list[str] | None = None
) -> str:
    """Launch; an instance whose driver could not even be submitted is FAILED at once, not left STARTING."""
    try:
        return launch(config, ledger, inst, local=local, extra_args=extra_args)
    except Exception as exc:
        ledger.set_instance(inst.id, state=InstanceState.FAILED, error=f"launch failed: {exc}")
        raise


FIRST_VERSION = "v1"


def current_version(ledger: Ledger, pipeline: str) -> str:
    """The version the pipeline runs now: its newest instance that ever committed (or was live),
    an aborted upgrade's green excepted (blue's version is the one that kept running, issue #34).

    A deploy or a recovery without a version resumes it, so following health's advice after an
    upgrade never silently brings an older version back.
    """
    instances = ledger.instances(pipeline)
    with ledger.tx() as conn:
        committed = {
            row[0]
            for row in conn.execute(
                select(s.batches.c.instance_id).where(s.batches.c.pipeline == pipeline).distinct()
            ).all()
        }
        aborted_ops = conn.execute(
            select(s.operations.c.data).where(
                s.operations.c.pipeline == pipeline,
                s.operations.c.kind == "upgrade",
                s.operations.c.state == "ABORTED",
            )
        ).all()
    aborted = {row[0].get("green_id") for row in aborted_ops}
    ran = [i for i in instances if (i.id in committed or i.state.live) and i.id not in aborted]
    return (ran or instances)[-1].version if instances else FIRST_VERSION


DEPLOY_REPORT = "deploy"  # one report per deploy run that created an instance: how a rerun finds it


def _created_by(ledger: Ledger, pipeline: str, key: str) -> dict | None:
    """The deploy report a run with this key wrote (so a rerun of its task moves on), or None."""
    for report in ledger.reports(pipeline, DEPLOY_REPORT, 20):
        if report["body"].get("key") == key:
            return dict(report["body"])
    return None


def submit(
    config: RelayConfig,
    version: str | None = None,
    local: bool = False,
    starting: str = "earliest",
    progress: Progress = _noop,
    extra_args: list[str] | None = None,
    key: str | None = None,
) -> dict:
    """Preflight, create the instance, submit its driver; does not wait for the first commit.

    ``key`` names the caller's run (an Airflow DAG run): a second call with the same key finds the
    instance the first one created and only submits it if that never happened, so the step can be
    cleared and rerun. Without a key (the CLI) a second call is refused as "already running".
    """
    t0 = time.time()
    ledger = Ledger(config.ledger_url)
    done = _created_by(ledger, config.pipeline, key) if key else None
    if done is not None:
        inst = ledger.instance(done["instance_id"])
        if inst.submission_id is None and inst.state.live:
            launch_or_fail(config, ledger, inst, local=local, extra_args=extra_args)
        progress(f"instance {inst.id} was created by this run already; moving on")
        return {**done, "submission_id": ledger.instance(inst.id).submission_id}
    inv = take_inventory(config, ledger)
    if inv.live or inv.apps:
        raise OperationError(
            f"pipeline {config.pipeline} is already running: {inv.describe()}. "
            "Nothing was started (stop it first, or upgrade it)."
        )
    if inv.master_error and not local:
        raise OperationError(f"cannot check the Spark master: {inv.master_error}")
    problem = None if local or inv.master is None else no_room(config, inv.master)
    if problem:  # its driver would wait for cores that other pipelines hold for as long as they run
        raise OperationError(
            f"pipeline {config.pipeline} can't start: {problem}; {HOW_TO_MAKE_ROOM}. Nothing was started."
        )
    last = ledger.instances(config.pipeline)
    color = last[-1].color if last else Color.BLUE
    if version is None:
        version = current_version(ledger, config.pipeline)
        progress(f"no version given: resuming {version}, the version {config.pipeline} ran last")
    inst, leases = create_instance(config, ledger, version, color, starting)
    summary = {
        "pipeline": config.pipeline,
        "instance_id": inst.id,
        "version": version,
        "color": color.value,
        "leases": leases,
        "started_at": t0,
    }
    if key:
        ledger.save_report(config.pipeline, DEPLOY_REPORT, "CREATED", {**summary, "key": key})
    progress(
        f"instance {inst.id} ({version}, {color.value}) holds {len(leases)} lease(s); starting its driver"
    )
    submission = launch_or_fail(config, ledger, inst, local=local, extra_args=extra_args)
    progress(f"driver {submission} submitted; waiting for the first commit")
    return {**summary, "submission_id": submission}


def deploy(
    config: RelayConfig,
    version: str | None = None,
    local: bool = False,
    starting: str = "earliest",
    wait_s: float = 300.0,
    progress: Progress = _noop,
    extra_args: list[str] | None = None,
) -> dict:
    """Start the pipeline unless something of it runs (ledger AND master agree); wait for its first commit."""
    submitted = submit(config, version, local, starting, progress, extra_args)
    ledger = Ledger(config.ledger_url)
    first = wait_until_active(config, ledger, submitted["instance_id"], wait_s, progress)
    progress(f"instance {submitted['instance_id']} is {first.state} after {first.seconds:.1f}s")
    started_at = submitted.pop("started_at")
    total_s = round(time.time() - started_at, 2)
    out = {**submitted, "first_commit_s": round(first.seconds, 2), "total_s": total_s}
    if config.standby == "hot":  # after the first commit: the standby waits beside an ACTIVE instance
        from relay.operations.standby import ensure_standby

        out["standby"] = ensure_standby(config, ledger, local, progress)
    return out
