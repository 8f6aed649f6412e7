"""Section ``throughput``: the counter's applied msg/s against a plain kafka-python consumer."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from relay.errors import OperationError

from .cluster import latest_offsets, wait_caught_up
from .context import Context, ensure_running, instance_batches
from .results import figure
from .stats import fmt_number, summarize


def throughput_from_batches(batches: Iterable[dict[str, Any]], latest: dict[int, int]) -> dict[str, Any]:
    """Applied msg/s from the ``batches`` rows of one instance.

    From the first committed batch's start to the commit of the first batch after which every
    partition's cursor reached ``latest`` (the end of the backlog); rows are the rows read by those
    batches. Returns also the batch count and the largest batch (to show maxOffsetsPerTrigger holds).
    """
    rows = sorted((b for b in batches if b["rows_read"] > 0), key=lambda b: (b["started_at"], b["batch_id"]))
    if not rows:
        return {
            "batches": 0,
            "rows": 0,
            "seconds": None,
            "msg_s": None,
            "max_batch_rows": None,
            "reached_latest": False,
        }
    reach: dict[int, int] = {}
    used: list[dict[str, Any]] = []
    reached = False
    for b in rows:
        used.append(b)
        for r in b.get("ranges") or []:
            reach[int(r["partition"])] = max(reach.get(int(r["partition"]), 0), int(r["to"]))
        if latest and all(reach.get(p, 0) >= off for p, off in latest.items()):
            reached = True
            break
    seconds = used[-1]["committed_at"] - used[0]["started_at"]
    total = sum(int(b["rows_read"]) for b in used)
    warm = used[1:]  # the first batch pays the Python workers' start: shown apart
    warm_s = warm[-1]["committed_at"] - warm[0]["started_at"] if warm else 0.0
    return {
        "batches": len(used),
        "rows": total,
        "seconds": seconds,
        "msg_s": total / seconds if seconds > 0 else None,
        "max_batch_rows": max(int(b["rows_read"]) for b in used),
        "first_batch_s": (used[0]["committed_at"] - used[0]["started_at"]),
        "warm_msg_s": sum(int(b["rows_read"]) for b in warm) / warm_s if warm_s > 0 else None,
        "read_ms": summarize([b["duration_ms"] - b["commit_ms"] for b in used if "duration_ms" in b]),
        "commit_ms": summarize([b["commit_ms"] for b in used if "commit_ms" in b]),
        "reached_latest": reached,
    }


def plain_consumer(bootstrap: str, topic: str, check_crcs: bool = True) -> dict[str, Any]:
    """Baseline: one kafka-python consumer, all partitions assigned, from beginning to end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, check_crcs=check_crcs
    )
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        rows = 0
        t0 = time.monotonic()
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for recs in consumer.poll(timeout_ms=1000, max_records=10_000).values():
                rows += len(recs)
        seconds = time.monotonic() - t0
    finally:
        consumer.close()
    return {"rows": rows, "seconds": seconds, "msg_s": rows / seconds if seconds > 0 else None}


def section_throughput(ctx: Context) -> dict[str, Any]:
    from relay.kafka.producer import produce

    cfg, opts = ctx.config, ctx.options
    ctx.progress(f"throughput: producing {opts.messages:,} messages over {cfg.partitions} partitions")
    produced = produce(cfg.kafka_bootstrap, cfg.topic, opts.messages, None, partitions=cfg.partitions)
    produce_rate = produced["sent"] / produced["seconds"] if produced["seconds"] else None
    ctx.progress(
        f"throughput: produced in {produced['seconds']:.1f}s ({fmt_number(produce_rate)} msg/s); "
        "baseline: plain kafka-python consumer"
    )
    base = plain_consumer(cfg.kafka_bootstrap, cfg.topic)
    ctx.progress(
        f"throughput: kafka-python read {base['rows']:,} in {base['seconds']:.1f}s "
        f"({fmt_number(base['msg_s'])} msg/s); now the counter "
        f"(maxOffsetsPerTrigger {cfg.max_offsets_per_trigger:,})"
    )
    latest = latest_offsets(cfg)
    t0 = time.time()
    instance_id = ensure_running(ctx)
    waited = wait_caught_up(cfg, ctx.progress, max(600.0, opts.messages / 200), "throughput")
    t1 = time.time()
    ctx.windows["throughput"] = (t0, t1)
    stats = throughput_from_batches(instance_batches(cfg, instance_id), latest)
    ctx.progress(
        f"throughput: the counter applied {stats['rows']:,} in {stats['batches']} batches, "
        f"{fmt_number(stats['msg_s'])} msg/s"
    )
    figures = [
        figure(
            "applied end to end (ledger commit incl.)",
            stats["msg_s"],
            "msg/s",
            "kafka-python consumer",
            base["msg_s"],
            better="higher",
        ),
        figure(
            "applied, batches after the first",
            stats["warm_msg_s"],
            "msg/s",
            "kafka-python consumer",
            base["msg_s"],
            better="higher",
        ),
        figure("first batch (Python workers start)", stats["first_batch_s"], "s"),
        figure("backlog batch: reading rows, median", stats["read_ms"]["median"], "ms"),
        figure("backlog batch: ledger commit, median", stats["commit_ms"]["median"], "ms"),
        figure(
            "max rows per batch",
            stats["max_batch_rows"],
            "rows",
            "maxOffsetsPerTrigger",
            cfg.max_offsets_per_trigger,
        ),
        figure("batches for the backlog", stats["batches"], "batches"),
        figure("deploy call -> backlog applied", t1 - t0, "s"),
    ]
    if stats["max_batch_rows"] and stats["max_batch_rows"] > cfg.max_offsets_per_trigger:
        raise OperationError(
            f"a batch read {stats['max_batch_rows']} rows, above maxOffsetsPerTrigger "
            f"{cfg.max_offsets_per_trigger}"
        )
    return {
        "figures": figures,
        "details": {
            "produce": produced,
            "produce_msg_s": produce_rate,
            "kafka_python": base,
            "relay": stats,
            "latest": latest,
            "instance_id": instance_id,
            "caught_up_wait_s": waited,
        },
    }
