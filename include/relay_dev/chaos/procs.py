"""Find the stack's processes by PID from /proc and kill them by PID.

Why /proc and not names: other developers run their own stacks on this machine. Every target is
found inside the process groups of this run's parts (the worker's group holds the drivers and
executors it launched), so nothing outside the private stack is ever signalled; no pkill, no killall.
What a killed part leaves behind is stopped by its supervised restart (``relay_dev.supervised_exec``).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from relay_dev.supervision import group_pids


@dataclass(frozen=True)
class Proc:
    """One live process: its parent, its process group and its command line."""

    pid: int
    ppid: int
    pgid: int
    cmdline: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.cmdline)

    @property
    def is_java(self) -> bool:
        return bool(self.cmdline) and Path(self.cmdline[0]).name.startswith("java")


def read_proc(pid: int) -> Proc | None:
    """The process ``pid`` (None when gone or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):
        return None
    cmd = tuple(c.decode(errors="replace") for c in raw.split(b"\0") if c)
    return Proc(pid, int(fields[1]), int(fields[2]), cmd)


def group(pgid: int) -> list[Proc]:
    """Every live process of process group ``pgid`` (a part's PID is its group's id)."""
    return [p for p in (read_proc(pid) for pid in group_pids(pgid)) if p is not None] if pgid else []


def driver_jvms(worker: int, marker: str = "") -> list[Proc]:
    """Cluster-mode driver JVMs the worker launched (``DriverWrapper``), optionally of one app only."""
    return [p for p in group(worker) if p.is_java and "DriverWrapper" in p.text and marker in p.text]


def driver_pythons(worker: int, jvm_pid: int, job_name: str = "pipeline_driver.py") -> list[Proc]:
    """The Python driver script run by one driver JVM (PythonRunner starts it as a child)."""
    return [
        p
        for p in group(worker)
        if p.ppid == jvm_pid and not p.is_java and any(c.endswith(job_name) for c in p.cmdline)
    ]


def executor_jvms(worker: int) -> list[Proc]:
    """Executor JVMs the worker launched (``CoarseGrainedExecutorBackend``)."""
    return [p for p in group(worker) if p.is_java and "CoarseGrainedExecutorBackend" in p.text]


def sigkill(pid: int) -> bool:
    """SIGKILL one process by PID; False when it was already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
