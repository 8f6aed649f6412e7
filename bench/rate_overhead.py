"""Baseline for Relay's micro-batch overhead: Spark's built-in ``rate`` source into a no-op foreachBatch.

Why: a tiny Relay batch pays for Spark (planning, offset and commit logs), for reading Kafka through
the Python data source and for the ledger transaction. This script measures what Spark alone costs
for a tiny batch on this machine -- the floor no Spark job can go under -- so ``relay bench`` can
print Relay's figure as a ratio against it. Run by ``relay bench`` as a subprocess (pyspark is not
imported by the library); it prints one JSON object on its last stdout line.

    python bench/rate_overhead.py --seconds 30 --work-dir var/bench/rate

Figures per batch (warm-up batches dropped): ``durationMs.triggerExecution`` from the query
progress, the wall time of the no-op foreachBatch, and the span between the checkpoint's
``offsets/N`` and ``commits/N`` writes (the same span ``relay bench`` measures for Relay's job).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="how long the query runs")
    p.add_argument("--rows-per-second", type=int, default=5)
    p.add_argument("--trigger-seconds", type=float, default=1.0)
    p.add_argument("--warmup-batches", type=int, default=2, help="first batches dropped (JIT, worker start)")
    p.add_argument("--work-dir", type=Path, required=True, help="checkpoint and Spark scratch (not /tmp)")
    return p.parse_args(argv)


def checkpoint_spans_ms(checkpoint: Path, batch_ids: list[int]) -> list[float]:
    """Per batch, ``commits/N`` mtime minus ``offsets/N`` mtime, in ms (batches with both files)."""
    spans = []
    for batch_id in batch_ids:
        offsets, commits = checkpoint / "offsets" / str(batch_id), checkpoint / "commits" / str(batch_id)
        if offsets.is_file() and commits.is_file():
            spans.append((commits.stat().st_mtime_ns - offsets.stat().st_mtime_ns) / 1e6)
    return spans


def field(progress: Any, name: str) -> Any:
    """A progress field: pyspark 4 returns StreamingQueryProgress objects (attributes; their dict
    ``get`` does not see the fields), older releases plain dicts."""
    if hasattr(progress, name):
        return getattr(progress, name)
    return progress[name]


def ran_batch(progress: Any) -> bool:
    """A trigger that ran a batch reports ``addBatch``; ``numInputRows`` stays 0 here because the
    no-op foreachBatch never reads its DataFrame (Spark counts rows as they are read)."""
    return "addBatch" in (field(progress, "durationMs") or {})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work: Path = args.work_dir.resolve()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark_jobs"))
    from local_session import local_session

    spark = local_session("relay-bench-rate-overhead", work, memory="512m")
    spark.sparkContext.setLogLevel("WARN")
    foreach_ms: dict[int, float] = {}

    def no_op(_df: Any, batch_id: int) -> None:
        """Touch nothing: a batch that does no work shows Spark's fixed cost per trigger."""
        t0 = time.perf_counter()
        foreach_ms[batch_id] = (time.perf_counter() - t0) * 1000

    checkpoint = work / f"checkpoint-{time.time_ns()}"
    try:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.rows_per_second)
            .load()
            .writeStream.foreachBatch(no_op)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=f"{args.trigger_seconds} seconds")
            .start()
        )
        # Measure ``seconds`` of batches: the clock starts at the first batch that ran, since
        # session start-up on a loaded machine can eat a fixed window.
        deadline = time.monotonic() + args.seconds * 3 + 120
        first_rows_at = None
        while time.monotonic() < deadline and query.isActive:
            if first_rows_at is None and any(ran_batch(p) for p in query.recentProgress):
                first_rows_at = time.monotonic()
            if first_rows_at is not None and time.monotonic() - first_rows_at >= args.seconds:
                break
            time.sleep(0.2)
        progress = [p for p in query.recentProgress if ran_batch(p)]
        query.stop()
    finally:
        spark.stop()
    warm = progress[args.warmup_batches :]
    ids = [int(field(p, "batchId")) for p in warm]
    out = {
        "batches": len(warm),
        "trigger_ms": [float(field(p, "durationMs")["triggerExecution"]) for p in warm],
        "foreach_ms": [foreach_ms[i] for i in ids if i in foreach_ms],
        "span_ms": checkpoint_spans_ms(checkpoint, ids),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
