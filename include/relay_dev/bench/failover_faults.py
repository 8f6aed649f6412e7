"""The failover section's host loss: two workers as two hosts, and SIGKILL of the active's whole one.

The bench stack runs one worker; the section adds the stack's second worker part (``spark-worker-2``,
what ``RELAY_SPARK_WORKERS=2`` starts) so that the hot standby waits on another worker than the
active's (relay.spark.placement). The fault SIGKILLs the process group of the active's worker: the
worker, the drivers on it (JVM and Python) and their executors, as when the host is lost. The
stack's supervisord restarts the worker (its wrapper first clears what is left of the group); the
section waits until the master lists it ALIVE again before it asks for the next standby, which is
then placed on the worker that came back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from relay.config import RelayConfig
from relay.errors import OperationError, RelayError
from relay.polling import poll

from relay_dev.chaos.procs import Proc, read_proc
from relay_dev.stack import WORKERS, LocalStack, Part
from relay_dev.supervision import group_pids

WORKER_BACK_S = 120.0


def add_second_worker(config: RelayConfig, progress: Callable[[str], None]) -> LocalStack:
    """Start the stack's second worker (a second host) when it is not running; the stack's ``down``
    stops it with the other parts (it is a program of the same supervisord)."""
    stack = LocalStack(config, progress=progress)
    stack.up_part(Part.SPARK_WORKER_2)
    return stack


def _master_state(config: RelayConfig) -> Any:
    from relay.spark.launcher import spark_client

    with contextlib.closing(spark_client(config)) as client:
        return client.master_state()


def worker_of(config: RelayConfig, stack: LocalStack, ledger: Any, instance_id: int) -> tuple[Part, str]:
    """(worker part, master's worker id) running the driver of ``instance_id``."""
    submission = ledger.instance(instance_id).submission_id or ""
    state = _master_state(config)
    driver = state.driver(submission)
    worker = next((w for w in state.workers if driver and w.id == driver.worker), None)
    for part in WORKERS:
        if worker is not None and worker.webui.endswith(f":{stack.worker_ui_port(part)}"):
            return part, worker.id
    raise OperationError(f"instance {instance_id}'s driver {submission!r} is on no worker of this stack")


def _kind(proc: Proc) -> str:
    """What one process of a worker's group is, for the record of what a host loss took."""
    text = proc.text
    for marker, kind in (
        ("deploy.worker.Worker", "worker"),
        ("DriverWrapper", "driver JVM"),
        ("CoarseGrainedExecutorBackend", "executor JVM"),
        ("pipeline_driver.py", "driver Python"),
    ):
        if marker in text:
            return kind
    return "python worker" if "python" in text else (proc.cmdline[0] if proc.cmdline else "?")


def _worker_back(config: RelayConfig, stack: LocalStack, part: Part, old_id: str) -> str:
    """Wait until a new worker of ``part`` (another id than ``old_id``) is ALIVE at the master."""
    ui = f":{stack.worker_ui_port(part)}"

    def back() -> str | None:
        with contextlib.suppress(RelayError):
            for w in _master_state(config).workers:
                if w.state == "ALIVE" and w.webui.endswith(ui) and w.id != old_id:
                    return str(w.id)
        return None

    found = poll(
        back,
        WORKER_BACK_S,
        0.5,
        on_timeout=lambda: OperationError(f"{part.value} not back at the master within {WORKER_BACK_S:.0f}s"),
    )
    assert found is not None
    return found


def lose_host(
    config: RelayConfig,
    stack: LocalStack,
    ledger: Any,
    active: int,
    standby: int,
    first_commit_after: Callable[[float], float],
    progress: Callable[[str], None],
) -> tuple[float, float, dict[str, Any]]:
    """SIGKILL the active's worker process group; (kill time, first commit after it, details).

    Refuses when the standby waits on the same worker (the loss would take both: not this fault).
    Returns after the killed worker is back at the master (supervisord restarts it)."""
    lost, lost_id = worker_of(config, stack, ledger, active)
    standby_part, _ = worker_of(config, stack, ledger, standby)
    details: dict[str, Any] = {
        "active": active,
        "active_worker": lost.value,
        "standby": standby,
        "standby_worker": standby_part.value,
        "standby_on_other_worker": standby_part is not lost,
    }
    if standby_part is lost:
        raise OperationError(f"the hot standby {standby} waits on the active's worker {lost.value}")
    pid = stack.pid(lost)
    if not pid:
        raise OperationError(f"{lost.value} has no PID")
    pgid = os.getpgid(pid)
    if pgid == os.getpgrp():
        raise OperationError(f"{lost.value} (pid {pid}) is in the bench's own process group")
    killed = [p for pid in group_pids(pgid) if (p := read_proc(pid)) is not None]
    details["killed"] = sorted(_kind(p) for p in killed)
    at = time.time()
    os.killpg(pgid, signal.SIGKILL)
    back = first_commit_after(at)
    progress(
        f"failover: SIGKILL worker host {lost.value} (group {pgid}): first commit {back - at:.1f}s later"
    )
    details["worker_back_id"] = _worker_back(config, stack, lost, lost_id)
    details["worker_back_s"] = round(time.time() - at, 1)
    progress(f"failover: {lost.value} back at the master {details['worker_back_s']}s after the kill")
    return at, back, details


def check_replaced(
    config: RelayConfig, stack: LocalStack, ledger: Any, active: int, standby: int, details: dict[str, Any]
) -> None:
    """Record where the standby placed after the host came back waits (the other worker than the
    new active's, i.e. the one that came back)."""
    active_part, _ = worker_of(config, stack, ledger, active)
    standby_part, _ = worker_of(config, stack, ledger, standby)
    details |= {
        "new_active": active,
        "new_active_worker": active_part.value,
        "new_standby": standby,
        "new_standby_worker": standby_part.value,
        "new_standby_on_other_worker": standby_part is not active_part,
    }
