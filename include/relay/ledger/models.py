"""Value objects and states of the ledger (plain dataclasses: picklable, printable, JSON-able)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class InstanceState(str, Enum):
    STANDBY = "STANDBY"  # an upgrade's green, submitted without leases: warming up, reads nothing
    READY = "READY"  # green warm (session, source, Python workers up): the handoff may give it leases
    STARTING = "STARTING"
    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    FENCED = "FENCED"

    @property
    def live(self) -> bool:
        """A live instance may still have a driver that writes."""
        return self in (
            InstanceState.STANDBY,
            InstanceState.READY,
            InstanceState.STARTING,
            InstanceState.ACTIVE,
            InstanceState.DRAINING,
        )

    @property
    def standby(self) -> bool:
        """Holds no lease yet: its source plans no batch until a handoff gives it one."""
        return self in (InstanceState.STANDBY, InstanceState.READY)


class AttemptState(str, Enum):
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"  # graceful stop, offsets == commits
    FENCED = "FENCED"  # a newer attempt took over, or the instance was fenced
    FAILED = "FAILED"  # will not be retried (bad arguments, data loss, crash loop)
    CRASHED = "CRASHED"  # a transient failure; the master's supervision relaunches it


class Color(str, Enum):
    BLUE = "blue"
    GREEN = "green"

    @property
    def other(self) -> Color:
        return Color.GREEN if self is Color.BLUE else Color.BLUE


@dataclass(frozen=True)
class Instance:
    id: int
    pipeline: str
    version: str
    color: Color
    state: InstanceState
    checkpoint_dir: str
    current_epoch: int
    stop_requested: bool
    submission_id: str | None
    app_name: str
    error: str | None
    created_at: float
    updated_at: float
    role: str | None = None
    """``hot-standby`` for a pipeline's hot standby (relay.protocol.failover), else None."""
    resources: dict[str, Any] | None = None
    """Spark resources over the configuration's (``relay scale``; RelayConfig.with_resources)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["color"], data["state"] = self.color.value, self.state.value
        return data


@dataclass(frozen=True)
class Attempt:
    id: int
    instance_id: int
    epoch: int
    state: AttemptState
    app_id: str | None
    host: str | None
    pid: int | None
    started_at: float
    heartbeat_at: float
    ended_at: float | None
    error: str | None
    driver_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data


@dataclass(frozen=True)
class Lease:
    """Offsets ``[start_offset, end_offset)`` of one partition that one instance may apply."""

    id: int
    pipeline: str
    instance_id: int
    topic: str
    partition: int
    start_offset: int
    end_offset: int | None
    next_offset: int
    opened_at: float
    closed_at: float | None

    @property
    def drained(self) -> bool:
        return self.end_offset is not None and self.next_offset >= self.end_offset

    def owns(self, offset: int) -> bool:
        return self.start_offset <= offset and (self.end_offset is None or offset < self.end_offset)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Gap:
    id: int
    pipeline: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    kind: str
    reason: str
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Offsets = dict[str, dict[int, int]]
"""topic -> partition -> offset (the next offset to read, as Spark's Kafka source stores it)."""


def offsets_to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def offsets_from_json(data: dict[str, dict[str, int]]) -> Offsets:
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}
