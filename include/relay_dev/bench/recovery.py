"""Section ``recovery``: ``recover(earliest)`` after records behind the cursor were deleted."""

from __future__ import annotations

import time
from typing import Any

from relay.errors import OperationError

from .cluster import cursors, latest_offsets, wait_caught_up
from .context import Context, ensure_running
from .results import figure


def section_recovery(ctx: Context) -> dict[str, Any]:
    from relay.kafka.offsets import KafkaOffsets
    from relay.kafka.producer import produce
    from relay.operations.recover import recover
    from relay.operations.stop import stop

    cfg, opts = ctx.config, ctx.options
    ensure_running(ctx)
    wait_caught_up(cfg, ctx.progress, 600, "recovery (draining first)")
    ctx.progress("recovery: stopping the pipeline, producing, deleting records behind the cursor")
    stop(cfg, progress=ctx.progress)
    produce(cfg.kafka_bootstrap, cfg.topic, opts.recovery_messages, None, partitions=cfg.partitions)
    cur = cursors(cfg)
    latest = latest_offsets(cfg)
    cut = {p: cur[p] + (latest[p] - cur[p]) // 2 for p in latest if p in cur and latest[p] > cur[p]}
    with KafkaOffsets(cfg.kafka_bootstrap) as kafka:
        kafka.delete_records(cfg.topic, cut)
    ctx.progress(f"recovery: deleted below {cut} (cursors {cur}); executing recover(earliest)")
    t0 = time.time()
    result = recover(
        cfg, strategy="earliest", dry_run=False, reason="relay bench", wait_s=600, progress=ctx.progress
    )
    seconds = time.time() - t0
    lost = int(result["plan"]["total_lost"])
    expected = sum(cut[p] - cur[p] for p in cut)
    figures = [
        figure(
            "recover() call -> new instance's first commit",
            seconds,
            "s",
            "cold deploy first commit",
            ctx.deploy_first_commit_s,
        ),
        figure("records declared lost", lost, "records", "records deleted", expected),
    ]
    if lost != expected:
        raise OperationError(f"recovery declared {lost} record(s) lost, {expected} were deleted")
    return {
        "figures": figures,
        "details": {
            "cut": cut,
            "cursors_before": cur,
            "latest": latest,
            "first_commit_s": result.get("first_commit_s"),
            "instance_id": result.get("instance_id"),
        },
    }
