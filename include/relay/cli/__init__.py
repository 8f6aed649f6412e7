"""``relay``: the command line. Every command calls the same library function as its Airflow DAG."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.cli.args import OneLineErrorParser, float_above, handoff_arg, int_at_least, version_arg
from relay.config import RelayConfig, load_config
from relay.config.bounds import MAX_CORES, MAX_LAG, MAX_RATE
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
    RELAY_LEDGER_URL must not start a new, empty ledger that a deploy would fill from scratch)."""
    from relay.ledger import schema
    from relay.ledger.engine import create_ledger, safe_url

    created = create_ledger(cfg.ledger_url)
    return {"ledger": safe_url(cfg.ledger_url), "created": created, "schema_version": schema.SCHEMA_VERSION}


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
    "scale": cmd_scale,
}


def _add_dev_commands(sub: argparse._SubParsersAction) -> None:
    """The developer commands (embedded stack, demo, benchmarks, chaos) come from ``relay_dev`` when it
    is installed; a job artifact or a production install carries only the runtime library."""
    try:
        from relay_dev.cli import register
    except ImportError:
        return
    COMMANDS.update(register(sub))


def _upgrade_options(p: argparse.ArgumentParser) -> None:
    """The plan switch and the gates, shared by upgrade and rollback."""
    p.add_argument("--plan", action="store_true", help="say what would happen and change nothing")
    p.add_argument(
        "--handoff", type=handoff_arg, default="latest", help='"latest" or JSON {"topic": {"0": 42}}'
    )
    p.add_argument(
        "--grace",
        type=float_above(0),
        default=300.0,
        help="seconds for green to report READY (warm standby)",
    )
    p.add_argument(
        "--catchup-timeout",
        type=float_above(0),
        default=120.0,
        help="seconds after the handoff for green to commit and get its lag within --max-lag",
    )
    p.add_argument(
        "--max-lag",
        type=int_at_least(0, MAX_LAG),
        default=None,
        help="records (all partitions) green may lag at the gate (default: RELAY_MAX_OFFSETS_PER_TRIGGER, "
        "else 20,000)",
    )
    p.add_argument(
        "--drain-timeout", type=float_above(0), default=600.0, help="seconds for blue to reach the handoff"
    )
    p.add_argument("--local", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="relay", description="Operate a Kafka -> Spark streaming pipeline.")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--pipeline",
        metavar="NAME",
        help="the pipeline to act on (before or after the subcommand); default RELAY_PIPELINE, else "
        "the pipelines file's default (see `relay pipelines`)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    lg = sub.add_parser("ledger", help="the ledger database (RELAY_LEDGER_URL)")
    lg.add_argument("action", choices=["init"], help="init: create the ledger (or migrate an existing one)")
    pr = sub.add_parser("produce", help="send counter messages (the seeds' KafkaApp)")
    pr.add_argument("--count", type=int_at_least(0), default=1000, help="messages to send (default 1000)")
    pr.add_argument(
        "--rate",
        type=float_above(0, MAX_RATE),
        default=None,
        help="messages per second (default: as fast as possible)",
    )
    pr.add_argument(
        "--poison", type=int_at_least(0), default=0, help="also send N messages the job cannot parse"
    )
    d = sub.add_parser("deploy", help="start the pipeline if nothing of it runs")
    d.add_argument(
        "--version",
        type=version_arg,
        help="default: the version the pipeline ran last (v1 on a first deploy)",
    )
    d.add_argument("--local", action="store_true", help="run the driver as a local process (no cluster)")
    d.add_argument("--starting", choices=["earliest", "latest"], default="earliest")
    d.add_argument("--wait", type=float_above(0), default=300.0, help="seconds to wait for the first commit")
    s = sub.add_parser("stop", help="stop the pipeline gracefully")
    s.add_argument("--timeout", type=float_above(0), default=120.0, help="seconds per instance")
    s.add_argument("--local", action="store_true")
    sub.add_parser("status", help="instances, attempts, leases, cursors, lag")
    sub.add_parser("offsets", help="earliest/latest/cursor per partition")
    au = sub.add_parser(
        "audit", help="every offset read applied exactly once, or declared lost? (exit 3 if not)"
    )
    au.add_argument(
        "--deep",
        action="store_true",
        help="re-read Kafka (read_committed) and compare offset by offset: tells offsets without a record "
        "(transaction markers, compaction) from missing records; read the sink and prove each input "
        "offset's effect is there once (local Spark re-evaluates the transform; needs the secret_env)",
    )
    c = sub.add_parser("checkpoint", help="inspect a Spark checkpoint")
    c.add_argument("action", choices=["inspect"])
    c.add_argument("path", nargs="?")
    b = sub.add_parser("build", help="freeze the current code as a job version (artifact)")
    b.add_argument("--version", type=version_arg, required=True)
    b.add_argument("--force", action="store_true", help="rebuild an existing version")
    b.add_argument(
        "--pipeline-code",
        type=Path,
        help="a pipeline package folder (<pkg>/pipeline.py defines PIPELINE); default RELAY_PIPELINE_CODE, "
        "else examples/counter (the seeds' counter) under the configured pipeline name and topic",
    )
    u = sub.add_parser("upgrade", help="blue-green upgrade to another version (resumes one in progress)")
    u.add_argument("--version", type=version_arg, required=True)
    _upgrade_options(u)
    sc = sub.add_parser("scale", help="move the running version to N executors (an exact handoff)")
    sc.add_argument("--executors", type=int_at_least(1, MAX_CORES), required=True)
    sc.add_argument("--executor-cores", type=int_at_least(1, MAX_CORES), help="default: unchanged")
    sc.add_argument("--executor-memory", help="a Spark size such as 1g (default: unchanged)")
    _upgrade_options(sc)
    rb = sub.add_parser("rollback", help="upgrade back to the version that ran before (or --to VERSION)")
    rb.add_argument("--to", type=version_arg, help="default: the version the running one replaced")
    _upgrade_options(rb)
    sub.add_parser("versions", help="built versions: who runs which, the rollback target, what is kept")
    r = sub.add_parser("recover", help="plan (default: dry run) or execute an offset-reset recovery")
    r.add_argument("--strategy", choices=["earliest", "latest", "timestamp", "offsets"], default="earliest")
    r.add_argument("--time", help="for --strategy timestamp: epoch ms or ISO 8601")
    r.add_argument("--offsets", help='for --strategy offsets: JSON {"0": 42, "1": 7}')
    r.add_argument("--execute", action="store_true", help="do it (without it: dry run, nothing changes)")
    r.add_argument("--reason", default="")
    r.add_argument("--allow-reprocess", action="store_true")
    r.add_argument("--local", action="store_true")
    health = sub.add_parser(
        "health", help="run the health checks once, persist the report (exit 2 if CRITICAL)"
    )
    health.add_argument(
        "--heal",
        action="store_true",
        help="first relaunch an ACTIVE instance whose driver Spark will never run again (as the DAG does)",
    )
    sub.add_parser("pipelines", help="the declared pipelines and their state in the ledger")
    sub.add_parser("standby", help='start a hot standby if the pipeline wants one (standby = "hot")')
    _add_dev_commands(sub)
    return p


def _take_pipeline(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], str | None]:
    """``--pipeline NAME`` (or ``=NAME``) out of ``argv``, wherever it stands, as ``--json`` is."""
    rest, name = [], None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--pipeline":
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                parser.error("argument --pipeline: expected a pipeline name")
            name, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--pipeline="):
            name = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    if name == "":
        parser.error("argument --pipeline: expected a pipeline name")
    return rest, name


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv  # accepted before or after the subcommand
    parser = build_parser()
    argv, pipeline = _take_pipeline(parser, argv)
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
