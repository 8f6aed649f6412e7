"""Find the stack's processes by PID from /proc, kill them by PID, sweep what a dead part left behind.

Why /proc and not names: other developers run their own stacks on this machine. Every target is
found inside the sessions this chaos run started (the worker's session holds the drivers and
executors it launched), so nothing outside the private stack is ever signalled; no pkill, no killall.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from relay_dev.stack import pid_alive, session_pids


@dataclass(frozen=True)
class Proc:
    """One live process: its parent, its session and its command line."""

    pid: int
    ppid: int
    sid: int
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
    return Proc(pid, int(fields[1]), int(fields[3]), cmd)


def session(sid: int) -> list[Proc]:
    """Every live process of session ``sid``."""
    return [p for p in (read_proc(pid) for pid in session_pids(sid)) if p is not None]


def driver_jvms(worker_sid: int, marker: str = "") -> list[Proc]:
    """Cluster-mode driver JVMs the worker launched (``DriverWrapper``), optionally of one app only."""
    return [p for p in session(worker_sid) if p.is_java and "DriverWrapper" in p.text and marker in p.text]


def driver_pythons(worker_sid: int, jvm_pid: int, job_name: str = "reference_job.py") -> list[Proc]:
    """The Python driver script run by one driver JVM (PythonRunner starts it as a child)."""
    return [
        p
        for p in session(worker_sid)
        if p.ppid == jvm_pid and not p.is_java and any(c.endswith(job_name) for c in p.cmdline)
    ]


def executor_jvms(worker_sid: int) -> list[Proc]:
    """Executor JVMs the worker launched (``CoarseGrainedExecutorBackend``)."""
    return [p for p in session(worker_sid) if p.is_java and "CoarseGrainedExecutorBackend" in p.text]


def sigkill(pid: int) -> bool:
    """SIGKILL one process by PID; False when it was already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _dying(pid: int) -> bool:
    """Still tearing down: alive, or a zombie leader whose other threads have not exited yet.

    A JVM's main thread shows ``Z`` while its other threads still exit; its parent cannot reap it
    until they are gone, so a restart started then would find the old process "alive".
    """
    if pid_alive(pid):
        return True
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    """True once every one of ``pids`` has exited (a SIGKILLed child of ours stays a zombie)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_dying(p) for p in pids):
            return True
        time.sleep(0.05)
    return not any(_dying(p) for p in pids)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused PID from the original)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def sweep_session(sid: int, leader_start: int | None = None) -> list[int]:
    """SIGKILL what is left of a dead part's session, as a platform does when a unit's main process
    dies (systemd's default KillMode=control-group); returns the PIDs it killed.

    ``leader_start`` guards against PID reuse: when a process with PID ``sid`` runs but started at
    another time, the session is someone else's and nothing is killed.
    """
    now = start_time(sid)
    if leader_start is not None and now is not None and now != leader_start:
        return []
    killed = []
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed
