"""Section ``overhead``: a small batch's cost against Spark's ``rate`` source with a no-op sink.

The baseline runs as a subprocess (``bench/rate_overhead.py``) so this package never imports pyspark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from relay.config import PROJECT_ROOT
from relay.errors import OperationError

from .cluster import wait_caught_up
from .context import Context, ensure_running, instance_batches, kill_child
from .results import figure
from .stats import fmt_number, summarize

RATE_SCRIPT = PROJECT_ROOT / "bench" / "rate_overhead.py"


def checkpoint_spans(checkpoint: str | Path, batch_ids: Iterable[int]) -> dict[int, float]:
    """Per batch, ms between Spark's writes of ``offsets/N`` (planned) and ``commits/N`` (done)."""
    root = Path(checkpoint)
    out = {}
    for b in batch_ids:
        o, c = root / "offsets" / str(b), root / "commits" / str(b)
        if o.is_file() and c.is_file():
            out[int(b)] = (c.stat().st_mtime_ns - o.stat().st_mtime_ns) / 1e6
    return out


def run_rate_baseline(ctx: Context, seconds: float) -> dict[str, Any]:
    """bench/rate_overhead.py in a subprocess of its own session; killed by its PID on any failure."""
    work = ctx.work_dir / "rate-baseline"
    work.mkdir(parents=True, exist_ok=True)
    (work / "tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": ctx.config.host,
        "TMPDIR": str(work / "tmp"),
        "PYSPARK_PYTHON": sys.executable,
    }
    log_path = ctx.work_dir / "logs" / "rate-baseline.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(RATE_SCRIPT), "--seconds", str(seconds), "--work-dir", str(work)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(PROJECT_ROOT),
            env=env,
        )
    ctx.children.append(proc)
    try:
        out, _ = proc.communicate(timeout=seconds + 240)
    except subprocess.TimeoutExpired:
        kill_child(proc)
        raise OperationError(f"the rate-source baseline did not finish; see {log_path}") from None
    finally:
        kill_child(proc)
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise OperationError(f"the rate-source baseline failed (exit {proc.returncode}); see {log_path}")
    return json.loads(lines[-1])


def section_overhead(ctx: Context) -> dict[str, Any]:
    from relay.kafka.producer import produce
    from relay.ledger.store import Ledger

    cfg, opts = ctx.config, ctx.options
    instance_id = ensure_running(ctx)
    wait_caught_up(cfg, ctx.progress, 600, "overhead (draining first)")
    count = int(opts.overhead_rate * opts.overhead_seconds)
    ctx.progress(
        f"overhead: producing {opts.overhead_rate:.0f} msg/s for {opts.overhead_seconds:.0f}s "
        "while the job runs with a 1 s trigger"
    )
    t0 = time.time()
    produce(cfg.kafka_bootstrap, cfg.topic, count, opts.overhead_rate, partitions=cfg.partitions)
    wait_caught_up(cfg, ctx.progress, 120, "overhead")
    small = [b for b in instance_batches(cfg, instance_id) if b["started_at"] >= t0 and b["rows_read"] > 0]
    if not small:
        raise OperationError("no batch committed while producing: cannot measure the overhead")
    ckpt = Ledger(cfg.ledger_url).instance(instance_id).checkpoint_dir
    spans = checkpoint_spans(ckpt, [b["batch_id"] for b in small])
    dur = summarize([b["duration_ms"] for b in small])
    com = summarize([b["commit_ms"] for b in small])
    span = summarize(list(spans.values()))
    rows = summarize([b["rows_read"] for b in small])
    ctx.progress(
        f"overhead: {dur['n']} small batches (median {fmt_number(rows['median'])} rows), median "
        f"{fmt_number(dur['median'])} ms; baseline: Spark rate source, no-op foreachBatch"
    )
    base = run_rate_baseline(ctx, max(opts.overhead_seconds, 10.0))
    if not base.get("trigger_ms"):
        raise OperationError("the rate-source baseline reported no batch")
    trig = summarize(base["trigger_ms"])
    bspan = summarize(base["span_ms"])
    figures = [
        figure(
            "small batch, foreachBatch median",
            dur["median"],
            "ms",
            "rate+no-op trigger median",
            trig["median"],
        ),
        figure("small batch, foreachBatch p95", dur["p95"], "ms", "rate+no-op trigger p95", trig["p95"]),
        figure("  of which ledger commit, median", com["median"], "ms"),
        figure("  of which ledger commit, p95", com["p95"], "ms"),
        figure(
            "offsets/N -> commits/N median", span["median"], "ms", "same span, rate+no-op", bspan["median"]
        ),
        figure("offsets/N -> commits/N p95", span["p95"], "ms", "same span, rate+no-op", bspan["p95"]),
    ]
    return {
        "figures": figures,
        "details": {
            "batches": dur,
            "commit_ms": com,
            "checkpoint_span_ms": span,
            "rows_per_batch": rows,
            "rate_baseline": {
                "trigger_ms": trig,
                "checkpoint_span_ms": bspan,
                "foreach_ms": summarize(base["foreach_ms"]),
                "rows_per_second": 5,
            },
        },
    }
