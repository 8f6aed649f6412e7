"""The developer commands of ``relay``: the embedded stack, its Airflow, the demo, benchmarks, chaos.

``relay.cli`` registers them when this package is installed (``make setup`` installs it); they are
never part of a job artifact.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from relay.cli.args import float_above, int_at_least
from relay.config import RelayConfig
from relay.errors import RelayError

from relay_dev.bench.options import SECTIONS


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_stack(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay_dev.airflow_local import LocalAirflow
    from relay_dev.stack import LocalStack

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
    from relay_dev.airflow_local import LocalAirflow

    local = LocalAirflow(cfg, progress=_say)
    return {"up": local.start, "down": local.stop, "status": local.status}[a.action]()


def cmd_run_demo(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    from relay_dev.demo import run_demo

    return run_demo(cfg, count=a.count, progress=_say)


def cmd_bench(cfg: RelayConfig, a: argparse.Namespace) -> Any:
    """Benchmarks on a private stack (never the configured one); the table is the human output."""
    from relay_dev.bench import BenchOptions, render_table, run_bench

    options = BenchOptions.build(quick=a.quick, messages=a.messages, only=a.only)
    if a.trigger_seconds is not None:
        options = replace(options, trigger_seconds=a.trigger_seconds)
    results_dir = Path(a.results_dir) if a.results_dir else None
    result = run_bench(options, progress=_say, host=cfg.host, results_dir=results_dir)
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
    from relay_dev.chaos.plan import ChaosOptions
    from relay_dev.chaos.report import render_table
    from relay_dev.chaos.runner import run_chaos

    options = ChaosOptions.build(
        seconds=a.seconds,
        minutes=a.minutes,
        kinds=a.kinds,
        seed=a.seed,
        rate=a.rate,
        postgres=a.postgres,
        lock_seconds=a.lock_seconds,
        per_kind=a.per_kind,
        pipeline_code=a.pipeline_code,
        standby=a.standby,
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


def register(sub: argparse._SubParsersAction) -> dict[str, Callable[[RelayConfig, argparse.Namespace], Any]]:
    """Add the developer subcommands to ``sub``; return their handlers by name."""
    st = sub.add_parser("stack", help="the embedded stack (broker, Spark master+worker, ledger)")
    st.add_argument("action", choices=["up", "down", "status"])
    st.add_argument("--postgres", action="store_true", help="also start a local PostgreSQL")
    st.add_argument("--no-airflow", action="store_true", help="without Airflow (Kafka, Spark, ledger only)")
    af = sub.add_parser("airflow", help="Airflow 3 of the embedded stack (api-server, scheduler, ...)")
    af.add_argument("action", choices=["up", "down", "status"])
    dm = sub.add_parser("run-demo", help="produce, deploy through Airflow, audit (the README's run command)")
    dm.add_argument("--count", type=int_at_least(1), default=2000)
    bn = sub.add_parser("bench", help="benchmarks against baselines on a private stack (var/bench/)")
    bn.add_argument("--quick", action="store_true", help="small sizes (50,000 messages): a few minutes")
    bn.add_argument("--messages", type=int_at_least(1), default=None, help="backlog for the throughput run")
    bn.add_argument(
        "--trigger-seconds",
        type=float_above(0, 60),
        default=None,
        help="every pipeline's trigger (default 1 s in the counter's sections, Relay's in pipeline, latency)",
    )
    bn.add_argument(
        "--only",
        default=None,
        help=f"comma-separated sections: {','.join(SECTIONS)}",
    )
    bn.add_argument("--results-dir", default=None, help="also write the result there, e.g. bench/results")
    ch = sub.add_parser("chaos", help="kill stack parts at random under load, then deep audit (var/chaos/)")
    length = ch.add_mutually_exclusive_group()
    length.add_argument(
        "--minutes", type=float_above(0), default=None, help="fault window (default: 10 minutes)"
    )
    length.add_argument("--seconds", type=float_above(0), default=None, help="fault window in seconds")
    ch.add_argument(
        "--kinds",
        default=None,
        help="comma-separated: driver,executor,worker,master,broker,scheduler,ledger-lock,ledger "
        "(ledger: the PostgreSQL ledger's server killed; needs --postgres) or all; default: all for "
        "a 10-minute run, all but scheduler for shorter ones (ledger only with --postgres)",
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
        "--pipeline-code",
        type=Path,
        default=None,
        help="a pipeline package run instead of the default, examples/counter (the seeds' counter, whose "
        "sink records each applied record in the ledger, where the deep audit counts them)",
    )
    ch.add_argument(
        "--standby",
        action="store_true",
        help="two workers and a hot standby on the other worker than the active's (worker and driver "
        "faults aim at the active's)",
    )
    ch.add_argument(
        "--per-kind",
        type=int_at_least(1),
        default=None,
        help="faults of each kind (default 22, or 1 per 40 s)",
    )
    return {
        "stack": cmd_stack,
        "airflow": cmd_airflow,
        "run-demo": cmd_run_demo,
        "bench": cmd_bench,
        "chaos": cmd_chaos,
    }
