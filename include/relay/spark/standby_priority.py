"""A warm standby gives the CPU to the pipeline it is about to replace, until it becomes the writer.

Why: on a shared host green's start-up (its driver's and executor's JVMs, Python workers, the
rehearsal batch) competed with blue for the cores, and blue's records waited: the worst latency of
every upgrade measured fell during green's start-up, ~75 s before the handoff (issue #12's pause).
So a standby lowers its CPU priority (a higher nice value) and takes its own back when it is READY,
and a driver that stops (blue after the handoff, with nothing left to apply) lowers its own before
its shutdown work competes with green's first batches.

Linux keeps the nice value per thread (``setpriority`` on a pid changes one thread) and a new
thread or process inherits its creator's, so a process tree is re-niced thread by thread
(``/proc/<pid>/task``). Any process may lower its priority, but taking it back needs root,
CAP_SYS_NICE or a high enough RLIMIT_NICE: where that is refused the standby does not lower it at
all, since a writer stuck at a low priority would slow the pipeline and leave the next upgrade's
standby its equal. Linux only (elsewhere nothing changes). No pyspark here: the driver and the
executors' tasks call these functions.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterable

log = logging.getLogger("relay.spark.standby_priority")

NICE_ENV = "RELAY_STANDBY_NICE"
DEFAULT_NICE = 10
"""CFS weight 110 against a default process's 1024: blue gets ~90% of a contended core."""
CAP_SYS_NICE = 23
MAX_HOPS = 2  # a Python worker -> the daemon -> its JVM; never further (an unrelated Java ancestor)
SPARK_MAIN = "org.apache.spark."  # in a driver's, an executor's and a local session's JVM command


def standby_nice(env: dict[str, str] | None = None) -> int:
    """The nice value a standby runs at (``RELAY_STANDBY_NICE``; 0 = do not lower)."""
    raw = (os.environ if env is None else env).get(NICE_ENV, "").strip()
    if not raw:
        return DEFAULT_NICE
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{NICE_ENV} must be an integer from 0 to 19, got {raw!r}") from None
    if not 0 <= value <= 19:
        raise ValueError(f"{NICE_ENV} must be an integer from 0 to 19, got {value}")
    return value


def can_take_back(nice: int) -> bool:
    """Whether this process may later set its priority back to ``nice`` (lower it again)."""
    if not hasattr(os, "setpriority"):
        return False
    if os.geteuid() == 0 or _has_cap_sys_nice():
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 20 - nice


def _has_cap_sys_nice() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except OSError:
        pass
    return False


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (a JVM's Python daemon and workers, a driver's JVM)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def threads(pid: int) -> list[int]:
    """The thread ids of ``pid`` (none when it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def renice(pids: Iterable[int], nice: int) -> int:
    """Set ``nice`` on every thread of ``pids``; how many threads changed (gone ones are skipped)."""
    changed = 0
    for tid in (tid for pid in pids for tid in threads(pid)):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            changed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return changed


def thread_nice(pids: Iterable[int]) -> set[int]:
    """The nice values found on the threads of ``pids`` (what ``renice`` set; gone ones skipped)."""
    found: set[int] = set()
    for tid in (tid for pid in pids for tid in threads(pid)):
        try:
            found.add(os.getpriority(os.PRIO_PROCESS, tid))
        except OSError:
            continue
    return found


def lower(root: int, nice: int, returning: bool = True) -> int | None:
    """Lower ``root``'s tree to ``nice``; its previous nice value, or None when nothing changed
    (switched off, already that low, not Linux, or, when ``returning``, a priority that could not
    be taken back; a process about to exit lowers it either way)."""
    if nice <= 0 or not os.path.isdir(f"/proc/{root}/task"):
        return None
    original = os.getpriority(os.PRIO_PROCESS, root)
    if nice <= original:
        return None
    if returning and not can_take_back(original):
        log.info("priority unchanged: taking it back needs root, CAP_SYS_NICE or RLIMIT_NICE")
        return None
    threads = renice(process_tree(root), nice)
    log.info("%d threads of process %d at nice %d (was %d)", threads, root, nice, original)
    return original


def take_back(root: int, original: int) -> int:
    """Set ``root``'s tree back to ``original`` (the writer's priority); threads changed."""
    threads = renice(process_tree(root), original)
    log.info("writer: %d threads of process %d back at nice %d", threads, root, original)
    return threads


def jvm_above(pid: int | None = None) -> int | None:
    """The JVM above a process: an executor's above its Python workers (worker -> daemon -> JVM), a
    cluster-mode driver's above the Python driver; None when no Java process is above ``pid``."""
    current = os.getpid() if pid is None else pid
    for _ in range(MAX_HOPS + 1):
        if not current or current <= 1:
            return None
        command = _cmdline(current)
        if command.split(" ", 1)[0].endswith("java") and SPARK_MAIN in command:
            return current
        current = _parent(current) or 0
    return None
