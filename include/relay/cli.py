"""``relay``: the command line. Every command calls the same library function as its Airflow DAG."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from relay.config import RelayConfig, load_config
from relay.errors import RelayError
from relay.inputs import (  # noqa: F401 - parse_* re-exported: callers imported them from here
    OneLineErrorParser,
    float_above,
    handoff_arg,
    int_at_least,
    parse_partition_offsets,
    parse_time_ms,
    recover_inputs,
    version_arg,
)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- commands
def cmd_stack(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.airflow_local import LocalAirflow
    from relay.stack import LocalStack

    stack = LocalStack(cfg, progress=_say)
    airflow = LocalAirflow(cfg, progress=_say)
    if a.action == "up":
        result = stack.up(with_postgres=a.postgres)
        if not a.no_airflow:
            result["airflow"] = airflow.start()
        return result
    if a.action == "down":
        return {"airflow": airflow.stop(), **stack.down()}
    return {**stack.status(), "airflow": airflow.status()}


def cmd_airflow(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.airflow_local import LocalAirflow

    local = LocalAirflow(cfg, progress=_say)
    return {"up": local.start, "down": local.stop, "status": local.status}[a.action]()


def cmd_ledger(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """``ledger init``: the explicit create (opening a ledger never creates one: a typo in
    RELAY_LEDGER_URL must not start a new, empty ledger that a deploy would fill from scratch)."""
    from relay.ledger import schema
    from relay.ledger.engine import create_ledger, safe_url

    created = create_ledger(cfg.ledger_url)
    return {"ledger": safe_url(cfg.ledger_url), "created": created, "schema_version": schema.SCHEMA_VERSION}


def cmd_produce(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.producer import produce

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


def cmd_status(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.status import status_view

    return status_view(cfg)


def cmd_offsets(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.status import offsets_view

    return offsets_view(cfg)


def cmd_audit(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Shallow: SQL counts over the ledger. --deep: also re-read Kafka (read_committed) to tell holes."""
    from relay.audit import audit

    return audit(cfg, deep=a.deep, progress=_say).to_json()


def cmd_checkpoint(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay import checkpoint
    from relay.ledger.store import Ledger

    path = a.path
    if path is None:
        instances = Ledger(cfg.ledger_url).instances(cfg.pipeline)
        if not instances:
            raise RelayError(f"pipeline {cfg.pipeline} has no instance yet: pass a checkpoint path")
        path = instances[-1].checkpoint_dir
    return checkpoint.inspect(path).to_json()


def cmd_build(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.artifacts import build_artifact

    art = build_artifact(cfg, a.version, fail_at_start=a.fail_at_start, force=a.force)
    return {"version": art.version, "folder": str(art.folder)}


def cmd_upgrade(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.upgrade import upgrade

    return upgrade(
        cfg,
        a.version,
        handoff=a.handoff,
        grace_s=a.grace,
        drain_timeout_s=a.drain_timeout,
        local=a.local,
        progress=_say,
    )


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


HEALTH_CRITICAL = "CRITICAL"


def cmd_health(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Run the checks once; the summary goes to stderr, the report to stdout, exit 2 when CRITICAL."""
    from relay.health import run_health

    report = run_health(cfg)
    _say(report.summary())
    return report.to_json()


def cmd_run_demo(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.demo import run_demo

    return run_demo(cfg, count=a.count, progress=_say)


def cmd_bench(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Benchmarks on a private stack (never the configured one); the table is the human output."""
    from relay.bench import BenchOptions, render_table, run_bench

    options = BenchOptions.build(quick=a.quick, messages=a.messages, only=a.only)
    result = run_bench(options, progress=_say, host=cfg.host)
    as_json = getattr(a, "json", False)
    if not as_json:
        print(render_table(result), flush=True)
    if not result["ok"]:
        if as_json:
            print(json.dumps(result, indent=2, default=str), flush=True)
        failed = [n for n, s in result["sections"].items() if s["status"] == "failed"]
        raise RelayError(
            f"failed section(s) {failed or result.get('stack_down_error')}; see {result['results_file']}"
        )
    return result if as_json else {"results_file": result["results_file"], "ok": result["ok"]}


def cmd_chaos(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Faults under load on a private stack (never the configured one); the table is the human output."""
    from relay.chaos.plan import ChaosOptions
    from relay.chaos.report import render_table
    from relay.chaos.runner import run_chaos

    options = ChaosOptions.build(
        seconds=a.seconds,
        minutes=a.minutes,
        kinds=a.kinds,
        seed=a.seed,
        rate=a.rate,
        postgres=a.postgres,
        lock_seconds=a.lock_seconds,
        per_kind=a.per_kind,
    )
    result = run_chaos(options, progress=_say, host=cfg.host)
    as_json = getattr(a, "json", False)
    if as_json:
        print(json.dumps(result, indent=2, default=str), flush=True)
    else:
        print(render_table(result), flush=True)
    if not result["ok"]:
        raise RelayError(f"{result['verdict']}; see {result['results_file']}")
    return {"results_file": result["results_file"], "ok": result["ok"]}


def _human(name: str, result: Any) -> str:
    if name == "offsets":
        return _table(result, ["topic", "partition", "earliest", "latest", "cursor", "lag", "invalidated"])
    if name == "audit":
        from relay.audit import render

        return render(result)
    return json.dumps(result, indent=2, default=str)


COMMANDS: dict[str, Callable[[RelayConfig, argparse.Namespace], Any]] = {
    "stack": cmd_stack,
    "airflow": cmd_airflow,
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
    "recover": cmd_recover,
    "health": cmd_health,
    "run-demo": cmd_run_demo,
    "bench": cmd_bench,
    "chaos": cmd_chaos,
}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="relay", description="Operate a Kafka -> Spark streaming pipeline.")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("stack", help="the embedded stack (broker, Spark master+worker, ledger)")
    st.add_argument("action", choices=["up", "down", "status"])
    st.add_argument("--postgres", action="store_true", help="also start a local PostgreSQL")
    st.add_argument("--no-airflow", action="store_true", help="without Airflow (Kafka, Spark, ledger only)")
    af = sub.add_parser("airflow", help="Airflow 3 of the embedded stack (api-server, scheduler, ...)")
    af.add_argument("action", choices=["up", "down", "status"])
    lg = sub.add_parser("ledger", help="the ledger database (RELAY_LEDGER_URL)")
    lg.add_argument("action", choices=["init"], help="init: create the ledger (or migrate an existing one)")
    pr = sub.add_parser("produce", help="send counter messages (the seeds' KafkaApp)")
    pr.add_argument("--count", type=int_at_least(0), default=1000, help="messages to send (default 1000)")
    pr.add_argument(
        "--rate", type=float_above(0), default=None, help="messages per second (default: as fast as possible)"
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
        "(transaction markers, compaction) from missing records",
    )
    c = sub.add_parser("checkpoint", help="inspect a Spark checkpoint")
    c.add_argument("action", choices=["inspect"])
    c.add_argument("path", nargs="?")
    b = sub.add_parser("build", help="freeze the current code as a job version (artifact)")
    b.add_argument("--version", type=version_arg, required=True)
    b.add_argument("--force", action="store_true", help="rebuild an existing version")
    b.add_argument("--fail-at-start", action="store_true", help="a deliberately broken version (tests)")
    u = sub.add_parser("upgrade", help="blue-green upgrade to another version (resumes one in progress)")
    u.add_argument("--version", type=version_arg, required=True)
    u.add_argument(
        "--handoff", type=handoff_arg, default="latest", help='"latest" or JSON {"topic": {"0": 42}}'
    )
    u.add_argument("--grace", type=float_above(0), default=300.0, help="seconds for green's first commit")
    u.add_argument(
        "--drain-timeout", type=float_above(0), default=600.0, help="seconds for blue to reach the handoff"
    )
    u.add_argument("--local", action="store_true")
    r = sub.add_parser("recover", help="plan (default: dry run) or execute an offset-reset recovery")
    r.add_argument("--strategy", choices=["earliest", "latest", "timestamp", "offsets"], default="earliest")
    r.add_argument("--time", help="for --strategy timestamp: epoch ms or ISO 8601")
    r.add_argument("--offsets", help='for --strategy offsets: JSON {"0": 42, "1": 7}')
    r.add_argument("--execute", action="store_true", help="do it (without it: dry run, nothing changes)")
    r.add_argument("--reason", default="")
    r.add_argument("--allow-reprocess", action="store_true")
    r.add_argument("--local", action="store_true")
    sub.add_parser("health", help="run the health checks once, persist the report (exit 2 if CRITICAL)")
    dm = sub.add_parser("run-demo", help="produce, deploy through Airflow, audit (the README's run command)")
    dm.add_argument("--count", type=int_at_least(1), default=2000)
    bn = sub.add_parser("bench", help="benchmarks against baselines on a private stack (var/bench/)")
    bn.add_argument("--quick", action="store_true", help="small sizes (50,000 messages): a few minutes")
    bn.add_argument("--messages", type=int_at_least(1), default=None, help="backlog for the throughput run")
    bn.add_argument(
        "--only",
        default=None,
        help="comma-separated sections: throughput,overhead,ledger,upgrade,recovery,memory",
    )
    ch = sub.add_parser("chaos", help="kill stack parts at random under load, then deep audit (var/chaos/)")
    length = ch.add_mutually_exclusive_group()
    length.add_argument(
        "--minutes", type=float_above(0), default=None, help="fault window (default: 10 minutes)"
    )
    length.add_argument("--seconds", type=float_above(0), default=None, help="fault window in seconds")
    ch.add_argument(
        "--kinds",
        default=None,
        help="comma-separated: driver,executor,worker,master,broker,scheduler,ledger-lock (or all); "
        "default: all for a 10-minute run, all but scheduler for shorter ones",
    )
    ch.add_argument(
        "--seed", type=int_at_least(0), default=None, help="seed of the fault schedule (default 1)"
    )
    ch.add_argument(
        "--rate", type=float_above(0), default=None, help="messages per second produced (default 200)"
    )
    ch.add_argument("--postgres", action="store_true", help="PostgreSQL ledger instead of SQLite")
    ch.add_argument(
        "--lock-seconds",
        type=float_above(0),
        default=None,
        help="how long each ledger lock is held (default 65 for a 10-minute run, past SQLite's 60 s busy "
        "timeout; 15 for shorter runs)",
    )
    ch.add_argument(
        "--per-kind",
        type=int_at_least(1),
        default=None,
        help="faults of each kind (default 22, or 1 per 40 s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv  # accepted before or after the subcommand
    args = build_parser().parse_args([a for a in argv if a != "--json"])
    args.json = as_json
    try:
        cfg = load_config()
        result = COMMANDS[args.command](cfg, args)
    except RelayError as exc:
        _say(f"relay {args.command}: {exc}")
        return 1
    print(json.dumps(result, indent=2, default=str) if args.json else _human(args.command, result))
    if args.command == "audit" and not result["ok"]:
        return 3
    if args.command == "health" and result["status"] == HEALTH_CRITICAL:
        return 2  # a cron job or a CI step alerts on the exit code, as the DAG's task fails
    return 0


if __name__ == "__main__":
    sys.exit(main())
