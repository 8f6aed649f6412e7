"""What Spark says a micro-batch's time went to, logged once per batch by the driver's supervision;
and when each start-up step ended (``log_startup``)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
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


def _jvm_started() -> float | None:
    """When the driver JVM (this Python driver's parent in cluster mode) started, in epoch seconds."""
    try:
        ticks = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(float(line.split()[1]) for line in stat if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_JVM_STARTED = _jvm_started()


def log_startup(step: str) -> None:
    """A start-up step's time since the driver JVM started (issue #31: where a start's seconds go)."""
    if _JVM_STARTED is not None:
        since_ms = (time.time() - _JVM_STARTED) * 1000
        log.info("start-up: %s at %.0f ms after the driver JVM started", step, since_ms)
