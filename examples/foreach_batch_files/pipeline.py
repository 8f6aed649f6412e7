"""ForEachBatch, the escape hatch: each batch written as JSON files to a directory named by its ranges.

Written only against Relay's public contract (``relay.pipeline``). Input values look like
``{"id": 7, "level": "error", "msg": "disk full"}``; the transform keeps errors and warnings. The
function runs on the driver per batch, but writes with a Spark action (``DataFrameWriter.json``), so
the records stay on the executors. How it keeps ``ForEachBatch``'s idempotence rules:

1. Replay: the directory is named by the batch's source ranges, and written with mode "overwrite".
   A batch handed over again after a crash has the same ranges (the cursors move all at once, in one
   ledger transaction per batch), so it replaces the same directory: written twice = written once.
   A reader takes only directories holding ``_SUCCESS`` (Spark writes it last).
2. Zombie: ``ctx.check_fence()`` right before the write (narrows the window, cannot close it).
3. Newest wins: a file never replaces another range's file.
4. Errors raise (the cursors move only once the function returned).
5. Predecessors: an instance that died after writing a batch and before its ledger commit (a
   failover, a crash during an upgrade) leaves a directory the next owner's first batch, planned to
   another end, would not overwrite. Before writing, a batch with ``ctx.predecessors`` deletes the
   directories whose ranges overlap its own on those partitions: nothing committed can overlap them
   (committed ranges end at the cursor this batch starts from).
"""

from __future__ import annotations

import hashlib
import operator
import os
import re
from collections.abc import Mapping
from functools import reduce
from typing import Any

from relay.pipeline import BatchContext, ForEachBatch, Pipeline

TOPIC = "foreach_batch_files"
OUTPUT_DIR_ENV = "FOREACH_BATCH_FILES_DIR"  # a folder or URL every executor and the driver can reach
VALUE_SCHEMA = "id BIGINT, level STRING, msg STRING"
MAX_NAME = 200  # a file name longer than this (many partitions) is replaced by a hash of the ranges


def transform(df):  # noqa: ANN001, ANN201 - pyspark DataFrames (imported on the executors, not here)
    """Parse; keep errors and warnings; keep topic, partition, offset (the contract; in the files
    they say where each record came from). Values that are not JSON parse to NULL and drop."""
    from pyspark.sql import functions as F

    parsed = df.select(
        "topic", "partition", "offset", F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v")
    )
    return parsed.where(F.col("v.level").isin("error", "warning") & F.col("v.id").isNotNull()).select(
        "topic", "partition", "offset", "v.id", "v.level", "v.msg"
    )


def batch_dir_name(ranges: Mapping[tuple[str, int], tuple[int, int]]) -> str | None:
    """``ranges-<topic>.<partition>.<first>-<end>_...`` of the non-empty ranges (None: nothing to do).

    Named by the ranges, not the batch id: the name says which records the directory holds, and a
    replay of the batch has the same ranges."""
    parts = sorted((t, p, a, b) for (t, p), (a, b) in ranges.items() if b > a)
    if not parts:
        return None
    name = "ranges-" + "_".join(f"{t}.{p}.{a}-{b}" for t, p, a, b in parts)
    if len(name) > MAX_NAME:
        name = "ranges-sha256-" + hashlib.sha256(name.encode()).hexdigest()[:40]
    return name


def overlaps(name: str, ranges: Mapping[tuple[str, int], tuple[int, int]], held: Any) -> bool | None:
    """Whether directory ``name`` holds offsets of ``ranges`` on a partition in ``held``; None when
    its name is a hash (the caller looks inside)."""
    if name.startswith("ranges-sha256-"):
        return None
    for topic, partition, a, b in parse_dir_name(name):
        first, end = ranges.get((topic, partition), (0, 0))
        if (topic, partition) in held and a < end and first < b:
            return True
    return False


PART = re.compile(r"(.+?)\.(\d+)\.(\d+)-(\d+)(?:_|$)")


def parse_dir_name(name: str) -> list[tuple[str, int, int, int]]:
    """``batch_dir_name``'s parts back, left to right (a topic may hold ``_``, the separator)."""
    body, at, parts = name.removeprefix("ranges-"), 0, []
    while at < len(body) and (m := PART.match(body, at)):
        parts.append((m[1], int(m[2]), int(m[3]), int(m[4])))
        at = m.end()
    return parts


def remove_predecessors_writes(root: str, df: Any, ctx: BatchContext) -> list[str]:
    """Rule 5: delete what dead predecessors wrote of this batch's ranges after their last commit.

    Through Spark's Hadoop filesystem, so any URL the write takes works; a hashed name is judged by
    its records' (topic, partition, offset)."""
    from pyspark.sql import functions as F

    spark = df.sparkSession
    jvm = spark._jvm
    base = jvm.org.apache.hadoop.fs.Path(root)
    fs = base.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(base):
        return []
    removed = []
    for status in fs.listStatus(base):
        name = status.getPath().getName()
        if not name.startswith("ranges-"):
            continue
        hit = overlaps(name, ctx.ranges, ctx.predecessors)
        if hit is None:
            held = [
                (F.col("topic") == t) & (F.col("partition") == p) & F.col("offset").between(a, b - 1)
                for (t, p), (a, b) in ctx.ranges.items()
                if (t, p) in ctx.predecessors
            ]
            rows = spark.read.schema("topic STRING, partition INT, offset BIGINT").json(str(status.getPath()))
            hit = bool(held) and not rows.where(reduce(operator.or_, held)).limit(1).isEmpty()
        if hit:
            fs.delete(status.getPath(), True)
            removed.append(name)
    return removed


def write_batch(root: str, df: Any, ctx: BatchContext) -> int:
    """One directory per batch range, overwritten on a replay; returns the rows written."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    name = batch_dir_name(ctx.ranges)
    if name is None:
        return 0
    counted = Observation(f"relay_batch_{ctx.batch_id}")
    out = df.observe(counted, F.count(F.lit(1)).alias("rows"))
    if ctx.predecessors:
        remove_predecessors_writes(root, df, ctx)  # rule 5, before this batch writes
    ctx.check_fence()  # rule 2: a zombie stops here (the target itself cannot fence a file)
    out.write.mode("overwrite").json(f"{root.rstrip('/')}/{name}")
    return int(counted.get["rows"])


def sink() -> ForEachBatch:
    """Built on the driver at start, where Relay put the variable (not when ``relay build`` imports)."""
    root = os.environ.get(OUTPUT_DIR_ENV)
    if not root:
        raise KeyError(f"{OUTPUT_DIR_ENV} is not set")
    return ForEachBatch(lambda df, ctx: write_batch(root, df, ctx))


PIPELINE = Pipeline(
    name="foreach_batch_files",
    topics=(TOPIC,),
    transform=transform,
    sink=sink,
    max_offsets_per_trigger=2000,
    secret_env=(OUTPUT_DIR_ENV,),  # how a setting reaches the driver (never argv or a log)
)
