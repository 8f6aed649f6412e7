"""Helpers shared by every test folder."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so test modules can `from tests.conftest import free_port, wait_for`
    sys.path.insert(0, str(ROOT))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; tiny race, acceptable in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60, interval: float = 0.2) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` on timeout (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Stop a process the test started, by its PID: ``sig``, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class Background(threading.Thread):
    """Runs ``fn`` and keeps its result or exception for the test."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc


class Phases:
    """Wall time of each phase of a long test, printed as it ends and as a table at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.seconds[name] = round(time.monotonic() - t0, 2)
        print(f"phase {name}: {self.seconds[name]}s", flush=True)

    def report(self) -> None:
        width = max((len(k) for k in self.seconds), default=0)
        print("\n".join(f"  {k:<{width}} {v:>8.2f}s" for k, v in self.seconds.items()), flush=True)
