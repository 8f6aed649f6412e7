"""Section ``memory``: peak RSS per part of the stack while the backlog ran, against the idle stack."""

from __future__ import annotations

from typing import Any

from relay.errors import OperationError

from .context import Context
from .results import figure


def section_memory(ctx: Context) -> dict[str, Any]:
    window = ctx.windows.get("throughput")
    scope = "throughput run" if window else "whole run (throughput not run)"
    peaks = ctx.sampler.peaks(*window) if window else ctx.sampler.peaks()
    whole = ctx.sampler.peaks()
    cats = peaks["categories"]

    def peak(cat: str) -> float | None:
        return cats.get(cat, {}).get("peak_rss_mb")

    figures = [
        figure("driver JVM peak RSS", peak("driver_jvm"), "MiB"),
        figure("executor JVM peak RSS", peak("executor_jvm"), "MiB"),
        figure("Python driver peak RSS", peak("python_driver"), "MiB"),
        figure("Python workers peak RSS (sum)", peak("python_workers"), "MiB"),
        figure("Python workers peak PSS (sum)", cats.get("python_workers", {}).get("peak_pss_mb"), "MiB"),
        figure(
            "whole stack peak RSS",
            peaks["stack_peak_rss_mb"],
            "MiB",
            "idle stack (no job)",
            ctx.idle_stack_rss_mb,
        ),
        figure(
            "whole stack peak RSS, whole run",
            whole["stack_peak_rss_mb"],
            "MiB",
            "idle stack (no job)",
            ctx.idle_stack_rss_mb,
        ),
    ]
    if not peaks["samples"]:
        raise OperationError("no memory sample was taken")
    return {"figures": figures, "details": {"scope": scope, "window": peaks, "whole_run": whole}}
