"""Memory of the stack's processes, sampled from /proc on a thread while the sections run."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def classify_process(cmdline: Sequence[str]) -> str:
    """Which part of the stack a process is, from its command line."""
    text = " ".join(cmdline)
    exe = Path(cmdline[0]).name if cmdline else ""
    if "noida-db" in text:
        return "kafka"
    if exe == "java" or exe.startswith("java"):
        if "DriverWrapper" in text or "PythonRunner" in text:
            return "driver_jvm"
        if "CoarseGrainedExecutorBackend" in text:
            return "executor_jvm"
        if "deploy.master.Master" in text:
            return "spark_master"
        if "deploy.worker.Worker" in text:
            return "spark_worker"
        return "other_jvm"
    if exe.startswith("python") or "python" in exe:
        if "pipeline_driver.py" in text:
            return "python_driver"
        return "python_workers"
    if "postgres" in exe or "postgres" in text[:40]:
        return "postgres"
    return "other"


def _proc_memory(pid: int) -> tuple[float, float, float] | None:
    """(VmRSS, VmHWM, Pss) of one process in MiB; None when it is gone."""
    rss = hwm = pss = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
                    break
    except OSError:
        return None
    return rss, hwm, pss


class MemorySampler:
    """Samples every process in the stack's sessions (drivers are children of the worker's session).

    Peak of a category = the largest sum of VmRSS of its processes seen in one sample; ``hwm_mb`` is
    the sum of each process's own VmHWM (an upper bound: processes need not peak together).
    """

    def __init__(self, sessions: Callable[[], list[int]], interval_s: float = 0.5) -> None:
        self.sessions = sessions
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._hwm: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def sample_once(self) -> dict[str, Any]:
        from relay_dev.stack import session_pids

        cats: dict[str, dict[str, float]] = {}
        for sid in self.sessions():
            for pid in session_pids(sid):
                mem = _proc_memory(pid)
                if mem is None:
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                cat = classify_process([c.decode(errors="replace") for c in cmd if c])
                agg = cats.setdefault(cat, {"rss": 0.0, "pss": 0.0, "procs": 0})
                agg["rss"] += mem[0]
                agg["pss"] += mem[2]
                agg["procs"] += 1
                self._hwm[pid] = (cat, max(mem[1], self._hwm.get(pid, (cat, 0.0))[1]))
        sample = {
            "at": time.time(),
            "categories": cats,
            "total_rss": sum(c["rss"] for c in cats.values()),
            "total_pss": sum(c["pss"] for c in cats.values()),
        }
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a sampling hiccup must never fail the benchmark
                self.sample_once()
            self._stop.wait(self.interval_s)

    def peaks(self, since: float | None = None, until: float | None = None) -> dict[str, Any]:
        return memory_peaks(
            [
                s
                for s in self.samples
                if (since is None or s["at"] >= since) and (until is None or s["at"] <= until)
            ],
            self._hwm if since is None and until is None else None,
        )


def memory_peaks(
    samples: list[dict[str, Any]], hwm: dict[int, tuple[str, float]] | None = None
) -> dict[str, Any]:
    """Per category the peak summed RSS/PSS over samples, and the whole stack's peak."""
    out: dict[str, Any] = {"samples": len(samples), "categories": {}}
    for s in samples:
        for cat, agg in s["categories"].items():
            cur = out["categories"].setdefault(cat, {"peak_rss_mb": 0.0, "peak_pss_mb": 0.0, "max_procs": 0})
            cur["peak_rss_mb"] = max(cur["peak_rss_mb"], round(agg["rss"], 1))
            cur["peak_pss_mb"] = max(cur["peak_pss_mb"], round(agg["pss"], 1))
            cur["max_procs"] = max(cur["max_procs"], int(agg["procs"]))
    for cat, peak in (hwm or {}).values():
        if cat in out["categories"]:
            cur = out["categories"][cat]
            cur["hwm_sum_mb"] = round(cur.get("hwm_sum_mb", 0.0) + peak, 1)
    out["stack_peak_rss_mb"] = round(max((s["total_rss"] for s in samples), default=0.0), 1) or None
    out["stack_peak_pss_mb"] = round(max((s["total_pss"] for s in samples), default=0.0), 1) or None
    return out
