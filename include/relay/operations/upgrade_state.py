"""The persisted states of a blue-green upgrade and what every step shares: reading, ending, reporting."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from enum import Enum

from relay.config import RelayConfig
from relay.errors import ConfigError
from relay.ledger.store import Ledger

Progress = Callable[[str], None]


class UpgradeState(str, Enum):
    PREFLIGHT = "PREFLIGHT"  # checked and opened; nothing started
    GREEN_WARMING = "GREEN_WARMING"  # green submitted as a warm standby (no leases); blue uncapped
    GREEN_READY = "GREEN_READY"  # green reported READY: the handoff may pick H now
    GREEN_STARTING = "GREEN_STARTING"  # handoff done: green owns [H, ...), the cutover gate runs
    DRAINING_BLUE = "DRAINING_BLUE"  # green passed the gate: blue applies the rest of [cursor, H)
    STOPPING_BLUE = "STOPPING_BLUE"
    DONE = "DONE"
    ABORTED = "ABORTED"
    FAILED = "FAILED"


TERMINAL = (UpgradeState.DONE.value, UpgradeState.ABORTED.value, UpgradeState.FAILED.value)
# Recoveries share the operations table: both kinds' terminal states end an operation.
ALL_TERMINAL = TERMINAL + ("EXECUTED", "PLANNED", "REFUSED")
# Until blue stops, a failed gate aborts: green is fenced and blue takes everything back.
ABORTABLE = (
    UpgradeState.PREFLIGHT.value,
    UpgradeState.GREEN_WARMING.value,
    UpgradeState.GREEN_READY.value,
    UpgradeState.GREEN_STARTING.value,
)


def noop(_: str) -> None:
    pass


def parse_handoff(handoff: str, topic: str) -> dict[int, int] | None:
    """``latest`` -> None (read at handoff time); else Spark-style JSON {"topic": {"0": 42}}."""
    if handoff == "latest":
        return None
    try:
        data = json.loads(handoff)
        return {int(p): int(o) for p, o in data[topic].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f'handoff must be "latest" or JSON like {{"{topic}": {{"0": 42}}}}, got {handoff!r}'
        ) from exc


def check_gates(grace_s: float, drain_timeout_s: float, catchup_s: float, max_lag: int | None) -> None:
    """Refuse gates no upgrade could keep (ConfigError), before anything is read or changed."""
    for name, value in (("grace", grace_s), ("drain timeout", drain_timeout_s), ("catch-up time", catchup_s)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
    if max_lag is not None and (isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0):
        raise ConfigError(f"max lag must be an integer >= 0 (records), got {max_lag!r}")


DEFAULT_GATE_LAG = 20_000  # records green may lag at the gate when no batch size is fixed


def resolved_max_lag(config: RelayConfig, max_lag: int | None) -> int:
    """The cutover gate's lag bound in records (None: one batch, maxOffsetsPerTrigger).

    One batch as the operator set it (pipelines file, ``RELAY_MAX_OFFSETS_PER_TRIGGER``), which the
    driver applies over the package's; else DEFAULT_GATE_LAG (batches are adaptive then; a package
    may fix its own size, which ``artifact.json`` does not record: pass ``max_lag`` to match it).
    """
    if max_lag is not None:
        return int(max_lag)
    return int(config.max_offsets_per_trigger or DEFAULT_GATE_LAG)


def result(op: dict) -> dict:
    """What the upgrade returns (and an Airflow task pushes): state, error, figures, history."""
    return {
        "upgrade_id": op["id"],
        "state": op["state"],
        "error": op.get("error"),
        **op["data"],
        "history": op["history"],
    }


def ended(config: RelayConfig, ledger: Ledger, op: dict) -> dict:
    """Persist the report of an upgrade that just reached a terminal state; its result."""
    out = result(op)
    ledger.save_report(config.pipeline, "upgrade", op["state"], json.loads(json.dumps(out, default=str)))
    return out


def in_state(ledger: Ledger, op_id: int, state: UpgradeState) -> dict | None:
    """The operation if it is in ``state``; None when it moved on (the step's work is done)."""
    op = ledger.operation(op_id)
    return op if op["state"] == state.value else None


def seconds(later: float | None, earlier: float | None) -> float | None:
    """A step's duration for the upgrade's figures (None when one end is unknown)."""
    if later is None or earlier is None:
        return None
    return round(float(later) - float(earlier), 2)
