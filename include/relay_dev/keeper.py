"""The keeper: brings the stack's supervisord back when it dies, and rotates the parts' logs.

Why a program of the supervisord it watches: it is started, stopped and restarted like every other
part, and, like them, it outlives supervisord (``supervised_exec``: parts log to their own files and
are adopted by the next supervisord). When supervisord is gone the keeper starts it again, on the same
configuration; the wrappers it starts adopt the parts still running, the keeper included. A stop on
purpose (``relay stack down``) stops the keeper first, so it never brings back what a person stopped.

The parts write their logs themselves, so supervisord no longer rotates them: the keeper does, by
copy and truncate (every writer appends, so a truncated file is written from its start again).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import time
from pathlib import Path

from relay.errors import StackError
from relay.polling import poll

from relay_dev.supervision import Supervisor

NAME = "supervisor-keeper"
EVERY_S = 2.0
LOG_MAX_BYTES = 50 * 1024 * 1024
LOG_BACKUPS = 3
SETTLE_S = 30.0


def rotate(logs_dir: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> list[Path]:
    """Copy each ``*.log`` over ``max_bytes`` to ``.1`` (older copies shifted, ``backups`` kept) and
    truncate it; the logs rotated."""
    rotated = []
    for log in sorted(logs_dir.glob("*.log")):
        with contextlib.suppress(OSError):
            if log.stat().st_size <= max_bytes:
                continue
            for i in range(backups - 1, 0, -1):
                older = log.with_name(f"{log.name}.{i}")
                if older.exists():
                    older.replace(log.with_name(f"{log.name}.{i + 1}"))
            shutil.copyfile(log, log.with_name(f"{log.name}.1"))
            with open(log, "r+b") as f:
                f.truncate(0)
            rotated.append(log)
    return rotated


def keep(supervisor: Supervisor, stop: list[int], every_s: float = EVERY_S) -> None:
    """Until a stop signal: supervisord back when it stopped answering and its process is gone."""
    while not stop:
        time.sleep(every_s)
        if stop:
            return
        rotate(supervisor.logs_dir)
        if supervisor.running():
            continue
        try:
            supervisor.ensure_running()
        except StackError as exc:  # alive but not answering (busy), or it failed to start: next round
            print(f"keeper: supervisord not brought back: {exc}", flush=True)
            continue
        print(f"keeper: supervisord was gone; started it again (pid {supervisor.pid()})", flush=True)
        settle(supervisor)


def settle(supervisor: Supervisor, timeout_s: float = SETTLE_S) -> None:
    """Once its programs left STARTING, restarts count from now: each program was just spawned
    again (a wrapper that adopted what ran), none of them a restart of the part."""

    def started() -> bool | None:
        infos = supervisor.infos()
        return True if infos and all(i.state != "STARTING" for i in infos.values()) else None

    poll(started, timeout_s)
    supervisor.mark_baseline(supervisor.configured())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay_dev.keeper")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--logs-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    keep(Supervisor(args.data_dir, args.logs_dir), stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
