"""The run's state file: what a namespace cluster created, written BEFORE creating it.

Why: a run killed hard (SIGKILL, a lost terminal) leaves namespaces and processes behind; a later
``cleanup(run_dir)`` must remove exactly those, never guess from name patterns. The file names the
namespaces (created or about to be), the supervisord of each host (PID and start time) and the
owner process, so a second run never cleans up a cluster whose owner still lives.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from relay.config.secret_files import write_private

from relay_dev.supervised_exec import _stat, start_time


@dataclass
class Proc:
    """A process as recorded: PID plus start time (a reused PID is another process)."""

    pid: int
    start: int | None

    def alive(self) -> bool:
        """Running (not a zombie) and the same process that was recorded."""
        fields = _stat(self.pid) if self.pid > 0 and self.start is not None else None
        return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == self.start

    @classmethod
    def of(cls, pid: int) -> Proc:
        return cls(pid, start_time(pid))


@dataclass
class RunState:
    """Everything the teardown of a run needs; saved after every change."""

    prefix: str
    subnet: str
    owner: Proc
    status: str = "starting"
    namespaces: list[str] = field(default_factory=list)
    supervisors: dict[str, Proc] = field(default_factory=dict)
    seen: list[Proc] = field(default_factory=list)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> RunState | None:
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return cls(
            prefix=raw["prefix"],
            subnet=raw["subnet"],
            owner=Proc(**raw["owner"]),
            status=raw.get("status", "starting"),
            namespaces=list(raw.get("namespaces", [])),
            supervisors={h: Proc(**p) for h, p in raw.get("supervisors", {}).items()},
            seen=[Proc(**p) for p in raw.get("seen", [])],
        )

    @classmethod
    def new(cls, prefix: str, subnet: str) -> RunState:
        return cls(prefix=prefix, subnet=subnet, owner=Proc.of(os.getpid()))

    def owner_alive(self) -> bool:
        return self.owner.pid != os.getpid() and self.owner.alive()
