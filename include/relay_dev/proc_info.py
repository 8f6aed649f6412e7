"""What /proc says about a process: alive, its session or group, its memory. Never names."""

from __future__ import annotations

from pathlib import Path


def pid_alive(pid: int | None) -> bool:
    """True for a live (not zombie) process."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def session_pids(sid: int) -> list[int]:
    """Live processes whose session or process group is ``sid``: a part and every child it left.

    A part run by supervisord leads its own process group (in supervisord's session); a process
    started with ``start_new_session`` leads both.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state ppid pgrp session ...
        if sid in (int(fields[2]), int(fields[3])) and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of one process, in MiB."""
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
