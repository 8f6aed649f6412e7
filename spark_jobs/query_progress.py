"""What Spark says a micro-batch's time went to, logged once per batch by the driver's supervision."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("relay.job")


def log_progress(query: Any, logged: tuple[int, str] | None) -> tuple[int, str] | None:
    """Log Spark's per-step times (``durationMs``) of the last batch that ran, once; its key.

    Where a batch's time goes around the tasks: latestOffset (the source's planning and the
    ledger's guard), walCommit (``offsets/N``), queryPlanning, addBatch (``foreachBatch``: the
    driver's steps are logged with the batch, then the tasks) and commitOffsets (``commits/N``).
    A trigger that found no data (no addBatch) is not logged. Diagnostics only: never fails.
    """
    try:
        progress = query.lastProgress
    except Exception:  # noqa: BLE001 - e.g. the query ending meanwhile: the loop below tells
        return logged
    if progress is None or "addBatch" not in progress.durationMs:
        return logged
    key = (progress.batchId, progress.timestamp)
    if key == logged:
        return logged
    steps = ", ".join(f"{k} {v}" for k, v in sorted(progress.durationMs.items()))
    log.info("batch %s: %s rows; Spark's steps (ms): %s", progress.batchId, progress.numInputRows, steps)
    return key
