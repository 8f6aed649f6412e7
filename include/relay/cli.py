"""``relay``: the command line. Every command calls the same library function as its Airflow DAG."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC
from typing import Any

from relay.config import RelayConfig, load_config
from relay.errors import RelayError


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
    from relay.audit import audit

    return audit(cfg).to_json()


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


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC when no zone is given)."""
    from datetime import datetime

    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise RelayError(f"time must be epoch milliseconds or ISO 8601, got {text!r}") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def parse_partition_offsets(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
        return {int(p): int(o) for p, o in data.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise RelayError(f'offsets must be JSON like {{"0": 42, "1": 7}}, got {text!r}') from exc


def cmd_recover(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay.operations.recover import recover

    return recover(
        cfg,
        strategy=a.strategy,
        timestamp_ms=parse_time_ms(a.time) if a.time else None,
        offsets=parse_partition_offsets(a.offsets),
        dry_run=not a.execute,
        reason=a.reason,
        allow_reprocess=a.allow_reprocess,
        local=a.local,
        progress=_say,
    )


def cmd_health(cfg: RelayConfig, a: argparse.Namespace) -> Any:
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


def _human(name: str, result: Any) -> str:
    if name == "offsets":
        return _table(result, ["topic", "partition", "earliest", "latest", "cursor", "lag", "invalidated"])
    if name == "audit":
        lines = [
            _table(
                [p | {"missing_ranges": p["missing_ranges"][:3]} for p in result["partitions"]],
                [
                    "partition",
                    "earliest",
                    "latest",
                    "applied_once",
                    "applied_twice_or_more",
                    "dead_letters",
                    "declared_lost",
                    "missing",
                    "missing_ranges",
                ],
            )
        ]
        lines.append(
            f"count = {result['message_count']}, applied rows = {result['applied_rows']}: "
            + ("OK, every offset applied exactly once or declared lost" if result["ok"] else "NOT OK")
        )
        return "\n".join(lines)
    return json.dumps(result, indent=2, default=str)


COMMANDS: dict[str, Callable[[RelayConfig, argparse.Namespace], Any]] = {
    "stack": cmd_stack,
    "airflow": cmd_airflow,
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
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relay", description="Operate a Kafka -> Spark streaming pipeline.")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("stack", help="the embedded stack (broker, Spark master+worker, ledger)")
    st.add_argument("action", choices=["up", "down", "status"])
    st.add_argument("--postgres", action="store_true", help="also start a local PostgreSQL")
    st.add_argument("--no-airflow", action="store_true", help="without Airflow (Kafka, Spark, ledger only)")
    af = sub.add_parser("airflow", help="Airflow 3 of the embedded stack (api-server, scheduler, ...)")
    af.add_argument("action", choices=["up", "down", "status"])
    pr = sub.add_parser("produce", help="send counter messages (the seeds' KafkaApp)")
    pr.add_argument("--count", type=int, default=1000)
    pr.add_argument(
        "--rate", type=float, default=None, help="messages per second (default: as fast as possible)"
    )
    pr.add_argument("--poison", type=int, default=0, help="also send N messages the job cannot parse")
    d = sub.add_parser("deploy", help="start the pipeline if nothing of it runs")
    d.add_argument("--version", default="v1")
    d.add_argument("--local", action="store_true", help="run the driver as a local process (no cluster)")
    d.add_argument("--starting", choices=["earliest", "latest"], default="earliest")
    d.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the first commit")
    s = sub.add_parser("stop", help="stop the pipeline gracefully")
    s.add_argument("--timeout", type=float, default=120.0)
    s.add_argument("--local", action="store_true")
    sub.add_parser("status", help="instances, attempts, leases, cursors, lag")
    sub.add_parser("offsets", help="earliest/latest/cursor per partition")
    sub.add_parser("audit", help="every offset applied exactly once, or declared lost?")
    c = sub.add_parser("checkpoint", help="inspect a Spark checkpoint")
    c.add_argument("action", choices=["inspect"])
    c.add_argument("path", nargs="?")
    b = sub.add_parser("build", help="freeze the current code as a job version (artifact)")
    b.add_argument("--version", required=True)
    b.add_argument("--force", action="store_true", help="rebuild an existing version")
    b.add_argument("--fail-at-start", action="store_true", help="a deliberately broken version (tests)")
    u = sub.add_parser("upgrade", help="blue-green upgrade to another version (resumes one in progress)")
    u.add_argument("--version", required=True)
    u.add_argument("--handoff", default="latest", help='"latest" or JSON {"topic": {"0": 42}}')
    u.add_argument("--grace", type=float, default=300.0, help="seconds for green's first commit")
    u.add_argument("--drain-timeout", type=float, default=600.0, help="seconds for blue to reach the handoff")
    u.add_argument("--local", action="store_true")
    r = sub.add_parser("recover", help="plan (default: dry run) or execute an offset-reset recovery")
    r.add_argument("--strategy", choices=["earliest", "latest", "timestamp", "offsets"], default="earliest")
    r.add_argument("--time", help="for --strategy timestamp: epoch ms or ISO 8601")
    r.add_argument("--offsets", help='for --strategy offsets: JSON {"0": 42, "1": 7}')
    r.add_argument("--execute", action="store_true", help="do it (without it: dry run, nothing changes)")
    r.add_argument("--reason", default="")
    r.add_argument("--allow-reprocess", action="store_true")
    r.add_argument("--local", action="store_true")
    sub.add_parser("health", help="run the health checks once and persist the report")
    dm = sub.add_parser("run-demo", help="produce, deploy through Airflow, audit (the README's run command)")
    dm.add_argument("--count", type=int, default=2000)
    bn = sub.add_parser("bench", help="benchmarks against baselines on a private stack (var/bench/)")
    bn.add_argument("--quick", action="store_true", help="small sizes (50,000 messages): a few minutes")
    bn.add_argument("--messages", type=int, default=None, help="backlog for the throughput run")
    bn.add_argument(
        "--only",
        default=None,
        help="comma-separated sections: throughput,overhead,ledger,upgrade,recovery,memory",
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
