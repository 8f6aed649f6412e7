"""The command line's arguments: one subparser per command, bounded types (``cli.args``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from relay.cli.args import OneLineErrorParser, float_above, handoff_arg, int_at_least, version_arg
from relay.config.bounds import MAX_CORES, MAX_LAG, MAX_PORT, MAX_RATE


def _add_dev_commands(sub: argparse._SubParsersAction, commands: dict[str, Any]) -> None:
    """The developer commands (embedded stack, demo, benchmarks, chaos) come from ``relay_dev`` when it
    is installed; a job artifact or a production install carries only the runtime library."""
    try:
        from relay_dev.cli import register
    except ImportError:
        return
    commands.update(register(sub))


def _upgrade_options(p: argparse.ArgumentParser) -> None:
    """The plan switch and the gates, shared by upgrade, scale and rollback."""
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


def build_parser(commands: dict[str, Any]) -> argparse.ArgumentParser:
    """Every command's arguments; the developer commands join ``commands`` where installed."""
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
    me = sub.add_parser("metrics", help="serve Prometheus metrics of every declared pipeline")
    me.add_argument("action", choices=["serve"])
    me.add_argument("--host", default="127.0.0.1")
    me.add_argument("--port", type=int_at_least(1, MAX_PORT), default=9464)
    sub.add_parser("standby", help='start a hot standby if the pipeline wants one (standby = "hot")')
    au = sub.add_parser("autoscale", help="apply the pipeline's lag policy once (its autoscale table)")
    au.add_argument("--plan", action="store_true", help="record and print the decision, scale nothing")
    nw = sub.add_parser("new", help="write a pipeline package to start from, declared in the pipelines file")
    nw.add_argument("what", choices=["pipeline"])
    nw.add_argument("name", help="the pipeline's name (lower-case letters, digits, '_'), its folder's too")
    nw.add_argument("--folder", type=Path, default=Path("."), help="where its folder goes (default: .)")
    nw.add_argument("--topic", default=None, help="the input topic (default: the name)")
    nw.add_argument("--partitions", type=int_at_least(1, 10_000), default=3, help="the topic's partitions")
    _add_dev_commands(sub, commands)
    return p


def take_pipeline(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], str | None]:
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
