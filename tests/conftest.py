"""Helpers shared by every test folder."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

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
