"""Network namespaces as hosts: a switch namespace holding a bridge, one veth pair per host.

Why a switch namespace: nothing is created in the root namespace (no interface, address or route
that could clash with the machine's or another run's), and deleting the switch tears the whole
wire down. Everything here acts only on namespaces whose names the caller passes (its own run's).

Threads: a network namespace is a property of a thread, so :func:`call_in_netns` runs a function in
a fresh thread that first joins the namespace; sockets (and processes, threads) made there belong
to it. That lets the orchestrator probe the hosts' services with Relay's own clients.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from relay.errors import StackError
from relay.polling import poll

from relay_dev.proc_info import pid_alive

NETNS_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000
BRIDGE = "br0"
T = TypeVar("T")


def ip_binary() -> str:
    path = shutil.which("ip") or "/usr/sbin/ip"
    if not Path(path).exists():
        raise StackError("the `ip` command (iproute2) is needed for the namespace cluster")
    return path


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; StackError with its message when it fails and ``check``."""
    done = subprocess.run(
        [ip_binary(), *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    if check and done.returncode != 0:
        raise StackError(f"ip {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def available() -> bool:
    """Root with iproute2 and unshare, and the kernel lets us make network and mount namespaces (a
    container may not): what the namespace cluster needs."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def exists(ns: str) -> bool:
    return (NETNS_DIR / ns).exists()


def add(ns: str) -> None:
    """Create ``ns`` with its loopback up; refuses a name that exists (it is not ours)."""
    if exists(ns):
        raise StackError(f"network namespace {ns} already exists")
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")


def add_switch(ns: str) -> None:
    """The switch: a namespace with one bridge every host's veth peer is attached to."""
    add(ns)
    ip("-n", ns, "link", "add", BRIDGE, "type", "bridge")
    ip("-n", ns, "link", "set", BRIDGE, "up")


def plug(switch_ns: str, host_ns: str, port: str, address: str, prefix_len: int) -> None:
    """A veth pair made inside the switch (``port`` there, ``eth0`` in the host), host address on eth0."""
    ip("-n", switch_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host_ns)
    ip("-n", switch_ns, "link", "set", port, "master", BRIDGE)
    ip("-n", switch_ns, "link", "set", port, "up")
    ip("-n", host_ns, "addr", "add", f"{address}/{prefix_len}", "dev", "eth0")
    ip("-n", host_ns, "link", "set", "eth0", "up")


def pids(ns: str) -> list[int]:
    """Processes whose network namespace is ``ns`` (the named file pins it: no inode reuse)."""
    if not exists(ns):
        return []
    done = ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def stop_pids(found: list[int], grace_s: float = 10) -> list[int]:
    """TERM, then KILL after ``grace_s``, the given PIDs; returns those still alive after that."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in found:
            if pid_alive(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        poll(lambda: None if any(pid_alive(p) for p in found) else True, wait, 0.1)
    return [p for p in found if pid_alive(p)]


def delete(ns: str) -> None:
    """Remove the name; the namespace goes when its last process does (ours are stopped first)."""
    if exists(ns):
        ip("netns", "del", ns)


def _setns(ns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise StackError(f"setns into {ns} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in_netns(ns: str, fn: Callable[[], T], name: str = "") -> T:
    """``fn()`` in a fresh thread inside network namespace ``ns``; its result, or its exception."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            _setns(ns)
            box["result"] = fn()
        except BaseException as exc:  # handed to the calling thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=name or f"netns-{ns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
