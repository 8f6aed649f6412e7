"""A relaunched driver does not wait for a predecessor attempt whose process is provably gone.

Its old Python driver ran on this host and no process has its PID: the relaunch after a Python
driver kill used to wait ~8 s for that attempt's heartbeat to age past 10 s (issue #17's relaunch
figure). Anything that can't be told here (another host, no PID, a PID someone has) still waits.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

from driver_checks import process_gone_here
from relay.ledger.models import Attempt, AttemptState


def attempt(host: str | None, pid: int | None) -> Attempt:
    now = time.time()
    return Attempt(1, 1, 1, AttemptState.RUNNING, None, host, pid, now, now, None, None)


def test_a_dead_process_on_this_host_is_gone() -> None:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: no process has its PID now
    assert process_gone_here(attempt(socket.gethostname(), child.pid))


def test_a_live_process_another_host_or_no_pid_is_waited_for() -> None:
    here = socket.gethostname()
    assert not process_gone_here(attempt(here, os.getpid()))
    assert not process_gone_here(attempt(f"not-{here}", 2**22 + 1))
    assert not process_gone_here(attempt(here, None))
    assert not process_gone_here(attempt(None, 12345))
