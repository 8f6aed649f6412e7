"""The state every section receives, the v1 deploy they share, and stopping the children they start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.config import RelayConfig

from .options import BenchOptions, Progress
from .sampler import MemorySampler


@dataclass
class Context:
    """What sections share: configuration, stack, timings other sections use as baselines."""

    config: RelayConfig
    options: BenchOptions
    progress: Progress
    sampler: MemorySampler
    work_dir: Path
    deploy_first_commit_s: float | None = None
    idle_stack_rss_mb: float | None = None
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)


def ensure_running(ctx: Context) -> int:
    """The pipeline's live instance id; deploys v1 (recording its first-commit time) when none runs."""
    from relay.ledger.store import Ledger
    from relay.operations.deploy import deploy

    live = Ledger(ctx.config.ledger_url).instances(ctx.config.pipeline, live_only=True)
    if live:
        return live[-1].id
    ctx.progress("deploying the counter (v1, examples/counter) on the bench cluster")
    info = deploy(ctx.config, version="v1", wait_s=600, progress=ctx.progress)
    if ctx.deploy_first_commit_s is None:
        ctx.deploy_first_commit_s = float(info["first_commit_s"])
    return int(info["instance_id"])


def instance_batches(config: RelayConfig, instance_id: int) -> list[dict[str, Any]]:
    from relay.ledger.store import Ledger

    return Ledger(config.ledger_url).recent_batches(config.pipeline, 1_000_000, instance_id)


def kill_child(proc: subprocess.Popen[bytes]) -> None:
    """Stop a subprocess this benchmark started (and its session, which it leads) by its PID."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def driver_stdout(config: RelayConfig, driver_id: str) -> str:
    """A cluster-mode driver's stdout (Python's log) from the worker's work dir, else through its UI."""
    path = config.spark_dir / "work" / driver_id / "stdout"
    if path.is_file():
        return path.read_text(errors="replace")
    from relay.spark.launcher import spark_client

    client = spark_client(config)
    try:
        return client.driver_log_tail(driver_id, 8 << 20, "stdout")
    finally:
        client.close()
