"""What supervisord starts for every part: clear the previous run's leftovers, then exec the part.

Why: supervisord watches one PID per program. When that process is SIGKILLed its children live on
(the Airflow scheduler's LocalExecutor workers, a Spark worker's drivers, PostgreSQL's backends),
hold ports or shared memory, and a second copy of them would run beside the new part. Before
exec'ing the real command this wrapper kills (TERM, then KILL) whatever is still alive of the
process group the previous run recorded, records its own group, and then ``os.execvpe``s the
command: the part keeps supervisord's PID, so supervisord signals and reaps the part itself.

It also ends a crash loop that supervisord's ``startsecs`` cannot see (a part that dies after
running longer than ``startsecs`` is restarted forever): after ``MAX_STARTS`` starts within
``WINDOW_S`` it exits 1 at once, so supervisord backs off and the program ends FATAL. ``relay stack
up`` clears the history (an explicit start by a person).

Parts outlive supervisord. A part writes its log itself (``--log``, opened here and made its
stdout and stderr before the exec): writing to supervisord's pipe, Airflow's triggerer and DAG
processor died within 30 s of supervisord's death (a write to a pipe nobody reads). And when
supervisord comes back (its keeper, ``relay_dev.keeper``, or ``relay stack up``), the wrapper it
starts finds the part it recorded still running and **adopts** it instead of starting a second copy:
it waits until the part ends, forwarding supervisord's stop signals to the part's group, then exits
so that supervisord starts the part anew. Nothing that runs is restarted: not the worker, so not
the drivers on it.

Stdlib only, started as ``python -I <this file>``: it must not depend on the environment it is
about to replace. The environment of the part comes from a 0600 JSON file (``--env-file``): secrets
never appear on a command line. ``--user`` drops root for PostgreSQL after the cleanup.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from relay.polling import poll

MAX_STARTS = 6
WINDOW_S = 120.0


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command (state is [0], pgrp [2], starttime [19])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def group_members(pgid: int, leader_start: int | None) -> list[int]:
    """Live processes of process group ``pgid``, [] when the number now names another group.

    Linux never reuses a PID still used as a group id, so members of a leaderless group are the
    recorded group's; a live leader with another start time is a new group that reused the number.
    """
    leader = _stat(pgid)
    if leader is not None and leader_start is not None and int(leader[19]) != leader_start:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        fields = _stat(int(entry.name))
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def clear_group(pgid: int, leader_start: int | None, grace_s: float) -> list[int]:
    """TERM the group's live members, KILL what is left after ``grace_s``; returns the PIDs found."""
    pids = group_members(pgid, leader_start)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in group_members(pgid, leader_start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        poll(lambda: None if group_members(pgid, leader_start) else True, wait, 0.1)
        if not group_members(pgid, leader_start):
            break
    return pids


def running(pid: int, start: int | None) -> bool:
    """``pid`` is alive and is the process that was recorded (same start time)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and (start is None or int(fields[19]) == start)


def adopt(name: str, pid: int, pgid: int, start: int | None) -> int:
    """Wait for a part that outlived its supervisord; stop signals go to its group. Exits 0 when it
    was stopped through this wrapper, 1 when it ended by itself (supervisord then starts it anew)."""
    asked: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, forward)
    print(f"supervised_exec: {name}: pid {pid} (group {pgid}) outlived its supervisord: adopted", flush=True)
    while running(pid, start):  # for the adopted part's whole life: its supervisor is this process
        time.sleep(0.5)
    print(f"supervised_exec: {name}: adopted pid {pid} ended", flush=True)
    return 0 if asked else 1


def log_to(path: Path) -> None:
    """The part's stdout and stderr: its own log file, appended to (not supervisord's pipe)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def drop_to(user: str) -> None:
    import pwd

    entry = pwd.getpwnam(user)
    os.initgroups(user, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="supervised_exec")
    parser.add_argument("--group-file", required=True, type=Path)
    parser.add_argument("--env-file", type=Path)
    parser.add_argument("--user")
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--log", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    name = args.group_file.stem
    if args.log is not None:
        log_to(args.log)
    try:
        previous = json.loads(args.group_file.read_text())
    except (OSError, ValueError):
        previous = {}
    part = previous.get("pid")
    if part and part != os.getpid() and running(int(part), previous.get("start")):
        return adopt(name, int(part), int(previous.get("pgid") or part), previous.get("start"))
    now = time.time()
    starts = [t for t in previous.get("starts", []) if now - t < WINDOW_S]
    if len(starts) >= MAX_STARTS:
        print(f"supervised_exec: {name} started {len(starts)} times in {WINDOW_S:.0f}s: crash loop, gave up")
        return 1
    old = previous.get("pgid")
    if old and old != os.getpgrp():
        killed = clear_group(int(old), previous.get("start"), args.grace)
        if killed:
            print(f"supervised_exec: {name}: stopped {len(killed)} leftover(s) of group {old}: {killed}")
    me = os.getpid()
    record = {"pgid": os.getpgrp(), "pid": me, "start": start_time(me), "starts": [*starts, now]}
    write_private(args.group_file, json.dumps(record))
    env = dict(os.environ)
    if args.env_file is not None:
        env = json.loads(args.env_file.read_text())
    if args.user:
        drop_to(args.user)
    sys.stdout.flush()
    os.execvpe(command[0], command, env)
    return 127  # not reached: execvpe replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
