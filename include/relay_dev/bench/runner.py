"""``run_bench``: start a private stack, run the chosen sections, always stop the stack by PID."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT
from relay.errors import RelayError

from .autoscale import section_autoscale
from .cluster import bench_config
from .context import Context, kill_child
from .failover import section_failover
from .failover_hosts import section_failover_hosts
from .latency import section_latency
from .ledger import section_ledger
from .memory import section_memory
from .options import SECTIONS, BenchOptions, Progress
from .overhead import section_overhead
from .pipeline import section_pipeline
from .recovery import section_recovery
from .results import load_average, machine_facts, new_result, write_result
from .sampler import MemorySampler
from .smallbatch import section_smallbatch
from .submit import section_submit
from .throughput import section_throughput
from .upgrade import section_upgrade

BENCH_DIR = PROJECT_ROOT / "var" / "bench"
RESULTS_DIR_ENV = "RELAY_BENCH_RESULTS_DIR"  # also write the result there (e.g. bench/results)


SECTION_FUNCS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "throughput": section_throughput,
    "overhead": section_overhead,
    "ledger": section_ledger,
    "upgrade": section_upgrade,
    "recovery": section_recovery,
    "memory": section_memory,
    "submit": section_submit,
    "pipeline": section_pipeline,
    "latency": section_latency,
    "smallbatch": section_smallbatch,
    "failover": section_failover,
    "failover-hosts": section_failover_hosts,
    "autoscale": section_autoscale,
}
# ledger runs in-process on private databases; failover-hosts on a namespace cluster of its own
NEEDS_STACK = frozenset(SECTIONS) - {"ledger", "failover-hosts"}


def results_copy_path(results_dir: Path, options: BenchOptions, stamp: str) -> Path:
    """``<dir>/<sections>-<stamp>.json`` (``all`` for every section): a file to commit."""
    label = "all" if set(options.only) == set(SECTIONS) else "-".join(options.only)
    return results_dir / f"{label}-{stamp}.json"


def run_bench(
    options: BenchOptions,
    progress: Progress | None = None,
    host: str = "127.0.0.1",
    results_dir: Path | None = None,
) -> dict[str, Any]:
    """Start a private stack, run the chosen sections, stop it (always), write and return the result.

    ``results_dir`` (else ``$RELAY_BENCH_RESULTS_DIR``): also write the final result there, e.g.
    ``bench/results``, as ``<sections>-<timestamp>.json``.
    """
    from relay_dev.stack import LocalStack, Part

    if results_dir is None and os.environ.get(RESULTS_DIR_ENV):
        results_dir = Path(os.environ[RESULTS_DIR_ENV])

    say = progress or (lambda _m: None)
    t_start = time.monotonic()

    def note(msg: str) -> None:
        say(f"[bench {time.monotonic() - t_start:6.1f}s] {msg}")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    data_dir = BENCH_DIR / stamp
    data_dir.mkdir(parents=True, exist_ok=False)
    data_dir.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    result = new_result(options, stamp, data_dir)
    result_path = BENCH_DIR / f"results-{stamp}.json"
    result["results_file"] = str(result_path)
    copy_path = results_copy_path(results_dir.resolve(), options, stamp) if results_dir else None
    if copy_path is not None:
        result["results_copy"] = str(copy_path)
    result["machine"] = machine_facts()
    note(
        f"machine: {result['machine']['cores']} cores, load {result['machine']['load_start']}; "
        f"sections {', '.join(options.only)}; data in {data_dir}"
    )
    config = bench_config(data_dir, options, host)
    stack = LocalStack(config, progress=note)

    def sessions() -> list[int]:
        """The parts' PIDs (each leads its process group: drivers and executors are in the worker's)."""
        parts = (Part.KAFKA, Part.SPARK_MASTER, Part.SPARK_WORKER)
        return [pid for part in parts if (pid := stack.pid(part))]

    sampler = MemorySampler(sessions)
    ctx = Context(config=config, options=options, progress=note, sampler=sampler, work_dir=data_dir)
    try:
        if NEEDS_STACK & set(options.only):
            note("starting the bench stack (noida-db, Spark master + worker) on free loopback ports")
            stack.up()
            ctx.idle_stack_rss_mb = sampler.sample_once()["total_rss"]
            sampler.samples.clear()
            sampler.start()
        for name in options.only:
            sec = result["sections"][name]
            t0 = time.monotonic()
            note(f"== {name}")
            try:
                out = SECTION_FUNCS[name](ctx)
                sec.update(status="ok", figures=out["figures"], details=out["details"])
            except Exception as exc:  # noqa: BLE001 - one section failing must not lose the others
                sec.update(status="failed", error=f"{type(exc).__name__}: {exc}")
                result["ok"] = False
                note(f"{name} FAILED: {type(exc).__name__}: {exc}")
            sec["seconds"] = round(time.monotonic() - t0, 1)
            write_result(result, result_path)  # partial results survive a crash of a later section
    finally:
        sampler.stop()
        for proc in ctx.children:
            kill_child(proc)
        try:
            if stack.supervisor.configured() or stack.supervisor.running():
                note("stopping the bench stack")
                stack.down()
        except RelayError as exc:
            result["ok"] = False
            result["stack_down_error"] = str(exc)
            note(f"stopping the stack: {exc}")
        result["machine"]["load_end"] = load_average()
        result["finished"] = time.strftime("%Y%m%d-%H%M%S")
        result["seconds"] = round(time.monotonic() - t_start, 1)
        write_result(result, result_path)
        if copy_path is not None:
            write_result(result, copy_path)
    note(
        f"done in {result['seconds']}s; results in {result_path}" + (f" and {copy_path}" if copy_path else "")
    )
    return result
