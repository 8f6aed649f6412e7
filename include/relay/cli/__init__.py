"""``relay``: the command line. Every command calls the same library function as its Airflow DAG."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from relay.cli.parser import build_parser, take_pipeline
from relay.config import RelayConfig, load_config
from relay.config.inputs import (  # noqa: F401 - parse_* re-exported: callers imported them from here
    parse_partition_offsets,
    parse_time_ms,
    recover_inputs,
)
from relay.errors import RelayError


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------- commands
def cmd_ledger(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """``ledger init``: the explicit create (opening a ledger never creates one: a typo in
    RELAY_LEDGER_URL must not start a new, empty ledger that a deploy would fill from scratch).
    An existing ledger is brought to this Relay's schema revision (Alembic's head)."""
    from relay.ledger.engine import create_ledger, safe_url
    from relay.ledger.revision import HEAD

    created = create_ledger(cfg.ledger_url)
    return {"ledger": safe_url(cfg.ledger_url), "created": created, "schema_revision": HEAD}


def cmd_produce(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.kafka.producer import produce

    return produce(
        cfg.kafka_bootstrap,
        cfg.topic,
        a.count,
        a.rate,
        poison=a.poison,
        partitions=cfg.partitions,
        progress=_say,
    )


def cmd_deploy(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.deploy import deploy

    return deploy(cfg, version=a.version, local=a.local, starting=a.starting, wait_s=a.wait, progress=_say)


def cmd_stop(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.stop import stop

    return stop(cfg, timeout_s=a.timeout, local=a.local, progress=_say)


def cmd_standby(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Start the pipeline's hot standby when it wants one and has none; its failovers."""
    from relay.ledger.store import Ledger
    from relay.operations.standby import ensure_standby, failovers

    ledger = Ledger(cfg.ledger_url)
    standby = ensure_standby(cfg, ledger, progress=_say)
    return {"pipeline": cfg.pipeline, **standby, "failovers": failovers(ledger, cfg.pipeline)}


def cmd_autoscale(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """The lag policy's decision on the last health checks, and the scale it asks for (not with --plan)."""
    from relay.operations.autoscale import autoscale

    return autoscale(cfg, progress=_say, act=not a.plan)


def cmd_new(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """``new pipeline NAME``: the package written, declared in the pipelines file, the next commands."""
    import os

    from relay.pipeline.pipelines_file import DEFAULT_FILE_NAME, pipelines_file_path
    from relay.pipeline.scaffold import new_pipeline

    file = pipelines_file_path(os.environ, cfg.data_dir) or cfg.data_dir / DEFAULT_FILE_NAME
    done = new_pipeline(
        a.name, a.folder, file, a.topic, a.partitions, current=(cfg.pipeline, cfg.topic, cfg.partitions)
    )
    _say(f"pipeline {a.name} written to {done['folder']} and declared in {file}; next:")
    for line in done["next"]:
        _say(f"  {line}")
    return done


def cmd_metrics(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """``metrics serve``: Prometheus metrics of every declared pipeline, until interrupted."""
    from relay.metrics.serve import serve

    try:
        serve(a.host, a.port, _say)
    except KeyboardInterrupt:
        pass
    return {"served": f"http://{a.host}:{a.port}/metrics"}


def cmd_status(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.status import status_view

    return status_view(cfg)


def cmd_offsets(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.status import offsets_view

    return offsets_view(cfg)


def cmd_audit(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Shallow: SQL counts over the ledger. --deep: also re-read Kafka (read_committed) to tell holes,
    and read an executor-side sink, judged against Kafka's input (``relay.audit.sink``)."""
    from relay.audit import audit

    return audit(cfg, deep=a.deep, sink=a.deep, progress=_say).to_json()


def cmd_checkpoint(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.ledger.store import Ledger
    from relay.protocol import checkpoint

    path = a.path
    if path is None:
        instances = Ledger(cfg.ledger_url).instances(cfg.pipeline)
        if not instances:
            raise RelayError(f"pipeline {cfg.pipeline} has no instance yet: pass a checkpoint path")
        path = instances[-1].checkpoint_dir
    return checkpoint.inspect(path).to_json()


def cmd_build(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Build, then prune old versions (never a running one, nor the rollback target)."""
    from relay.artifacts import build_artifact
    from relay.ledger.store import Ledger
    from relay.operations.rollback import prune_versions

    art = build_artifact(cfg, a.version, force=a.force, pipeline_code=a.pipeline_code)
    pruned = prune_versions(cfg, Ledger(cfg.ledger_url))
    if pruned.get("skipped"):
        _say(f"versions not pruned: {pruned['skipped']}")
    return {
        "version": art.version,
        "folder": str(art.folder),
        "code_hash": art.code_hash(),
        "pipeline": art.pipeline,
        "pruned": pruned["removed"],
    }


def _gates(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "handoff": a.handoff,
        "grace_s": a.grace,
        "drain_timeout_s": a.drain_timeout,
        "catchup_s": a.catchup_timeout,
        "max_lag": a.max_lag,
        "local": a.local,
    }


def cmd_upgrade(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """``--plan``: what the upgrade would do, changing nothing; else the upgrade itself."""
    if a.plan:
        from relay.operations.upgrade_plan import plan_upgrade

        return plan_upgrade(cfg, a.version, **_gates(a))
    from relay.operations.upgrade import upgrade

    return upgrade(cfg, a.version, progress=_say, **_gates(a))


def cmd_scale(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """The running version moved to other Spark resources through the upgrade's exact handoff."""
    from relay.operations.scale import scale

    return scale(cfg, a.executors, a.executor_cores, a.executor_memory, _say, a.plan, **_gates(a))


def cmd_rollback(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.rollback import plan_rollback, rollback

    if a.plan:
        return plan_rollback(cfg, a.to, **_gates(a))
    return rollback(cfg, a.to, progress=_say, **_gates(a))


def cmd_versions(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.ledger.store import Ledger
    from relay.operations.rollback import versions_view

    return versions_view(cfg, Ledger(cfg.ledger_url))


def cmd_recover(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.recover import recover

    checked = recover_inputs(a.strategy, a.time, a.offsets)  # refused here, before the ledger is opened
    return recover(
        cfg,
        strategy=checked.strategy,
        timestamp_ms=checked.timestamp_ms,
        offsets=checked.offsets,
        dry_run=not a.execute,
        reason=a.reason,
        allow_reprocess=a.allow_reprocess,
        local=a.local,
        progress=_say,
    )


def cmd_pipelines(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """The declared pipelines (the pipelines file, else the environment's one) and their state."""
    from relay.operations.status import pipelines_view

    return pipelines_view()


HEALTH_CRITICAL = "CRITICAL"
PLAN_BLOCKED = 4  # exit code of a plan (upgrade or rollback --plan) that says the upgrade can't run
OPERATION_NOT_DONE = 5  # an upgrade or rollback that ended ABORTED or FAILED


def cmd_health(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Run the checks once; the summary goes to stderr, the report to stdout, exit 2 when CRITICAL."""
    from relay.health import run_health

    report = run_health(cfg, heal=a.heal)
    _say(report.summary())
    return report.to_json()


COMMANDS: dict[str, Callable[[RelayConfig, argparse.Namespace], Any]] = {
    "ledger": cmd_ledger,
    "produce": cmd_produce,
    "deploy": cmd_deploy,
    "stop": cmd_stop,
    "status": cmd_status,
    "offsets": cmd_offsets,
    "audit": cmd_audit,
    "checkpoint": cmd_checkpoint,
    "build": cmd_build,
    "upgrade": cmd_upgrade,
    "rollback": cmd_rollback,
    "versions": cmd_versions,
    "recover": cmd_recover,
    "health": cmd_health,
    "pipelines": cmd_pipelines,
    "standby": cmd_standby,
    "autoscale": cmd_autoscale,
    "new": cmd_new,
    "scale": cmd_scale,
    "metrics": cmd_metrics,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv  # accepted before or after the subcommand
    parser = build_parser(COMMANDS)
    argv, pipeline = take_pipeline(parser, argv)
    args = parser.parse_args([a for a in argv if a != "--json"])
    args.json, args.pipeline = as_json, pipeline
    try:
        cfg = load_config(pipeline=pipeline)
        result = COMMANDS[args.command](cfg, args)
    except RelayError as exc:
        _say(f"relay {args.command}: {exc}")
        return 1
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        from relay.cli.render import render

        render(args.command, result)
    return exit_code(args, result)


def exit_code(args: argparse.Namespace, result: Any) -> int:
    """What a script or CI step acts on (docs/operations.md, "Exit codes")."""
    if args.command == "audit" and not result["ok"]:
        return 3
    if args.command == "health" and result["status"] == HEALTH_CRITICAL:
        return 2  # a cron job or a CI step alerts on the exit code, as the DAG's task fails
    if args.command in ("upgrade", "rollback", "scale") and args.plan:
        return PLAN_BLOCKED if result["blocked"] else 0  # `relay upgrade --plan && relay upgrade`
    if args.command in ("upgrade", "rollback", "scale") and result.get("state") != "DONE":
        return OPERATION_NOT_DONE  # ABORTED (blue kept running) or FAILED: never a silent 0
    return 0
