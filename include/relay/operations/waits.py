"""The conditions an operation waits for, each checked once per call: first commit, drain, stop, apps.

Why one check at a time: the CLI loops over them in-process, while Airflow hands them to a trigger
that polls from the triggerer (no worker held). Both must judge the same way, so the judgement lives
here and the waiting lives with the caller. A check returns a JSON-able dict once the condition holds,
None while it may still, and raises :class:`OperationError` when it never will (a dead driver).
"""

from __future__ import annotations

from typing import Any, Protocol

from relay.config import RelayConfig
from relay.errors import OperationError
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.operations.inventory import master_apps
from relay.polling import poll
from relay.spark.first_commit import FirstCommitWait
from relay.spark.launcher import driver_running

FIRST_COMMIT = "first_commit"
READY = "ready"
CAUGHT_UP = "caught_up"
DRAINED = "drained"
DRIVERS_STOPPED = "drivers_stopped"
ONLY_APPS = "only_apps"
WAITS = (FIRST_COMMIT, READY, CAUGHT_UP, DRAINED, DRIVERS_STOPPED, ONLY_APPS)


class WaitTimeout(OperationError):
    """The condition did not hold in time (the check itself never said it never will)."""


class Wait(Protocol):
    def check(self) -> dict[str, Any] | None: ...


class CaughtUpWait:
    """The cutover gate: after the handoff green committed, and its lag is at most ``max_lag``.

    Lag is Kafka's latest offset minus green's cursor, summed over green's open leases. Right after
    the handoff the lag is near zero before green did anything, so when records arrived past H green
    must also have moved a cursor past H: the gate proves green processes, not only that it runs.
    Green's driver failing ends the wait at once (:class:`FirstCommitWait`'s checks).
    """

    def __init__(
        self, config: RelayConfig, ledger: Ledger, instance_id: int, max_lag: int, handoff: dict[str, int]
    ) -> None:
        self.config, self.ledger, self.instance_id = config, ledger, instance_id
        self.max_lag, self.handoff = max_lag, {int(p): int(o) for p, o in handoff.items()}
        self.committed = FirstCommitWait(config, ledger, instance_id)
        self.lag: int | None = None  # as the last check measured it
        self.moved = False

    def check(self) -> dict[str, Any] | None:
        if self.committed.check() is None:
            return None
        with KafkaOffsets(self.config.kafka_bootstrap) as kafka:
            latest = kafka.latest(self.config.topic)
        cursors = {
            le.partition: le.next_offset
            for le in self.ledger.leases(self.instance_id)
            if le.end_offset is None and le.topic == self.config.topic
        }
        self.lag = sum(max(latest.get(p, c) - c, 0) for p, c in cursors.items())
        arrived = any(latest.get(p, h) > h for p, h in self.handoff.items())
        self.moved = any(cursors.get(p, h) > h for p, h in self.handoff.items())
        if self.lag <= self.max_lag and (self.moved or not arrived):
            return {"instance_id": self.instance_id, "lag": self.lag, "max_lag": self.max_lag}
        return None

    def shortfall(self) -> str:
        """Why the gate is not passed yet, as the last check saw it."""
        if self.lag is None:
            return "no commit yet"
        if not self.moved:
            return f"no commit past the handoff (lag {self.lag} records)"
        return f"lag {self.lag} records > {self.max_lag}"


class DrainedWait:
    """Every closed lease of the instance reached its end (blue applied everything up to H).

    A dead blue does not end the wait: its rest is taken over by the next start (see the upgrade).
    """

    def __init__(self, ledger: Ledger, instance_id: int) -> None:
        self.ledger, self.instance_id = ledger, instance_id

    def check(self) -> dict[str, Any] | None:
        closed = [le for le in self.ledger.leases(self.instance_id) if le.end_offset is not None]
        if all(le.drained for le in closed):
            return {"instance_id": self.instance_id, "leases": len(closed)}
        return None


class DriversStoppedWait:
    """No driver of these instances runs any more (each follows a driver the master relaunched)."""

    def __init__(self, config: RelayConfig, ledger: Ledger, instance_ids: list[int]) -> None:
        self.config, self.ledger, self.instance_ids = config, ledger, list(instance_ids)

    def check(self) -> dict[str, Any] | None:
        for instance_id in self.instance_ids:
            if driver_running(self.config, self.ledger.instance(instance_id).submission_id):
                return None
        return {"instance_ids": self.instance_ids}


class OnlyAppsWait:
    """The Spark master (the outside view) lists exactly these applications of the pipeline."""

    def __init__(self, config: RelayConfig, names: list[str]) -> None:
        self.config, self.names = config, sorted(names)

    def check(self) -> dict[str, Any] | None:
        listed = sorted(a.name for a in master_apps(self.config, self.config.pipeline))
        return {"apps": listed} if listed == self.names else None

    def mismatch(self) -> str:
        listed = sorted(a.name for a in master_apps(self.config, self.config.pipeline))
        return (
            f"the Spark master lists {listed or 'nothing'} of {self.config.pipeline}, expected {self.names}"
        )


def make_wait(config: RelayConfig, ledger: Ledger, kind: str, args: dict[str, Any]) -> Wait:
    """A wait from its JSON description (what a trigger serializes)."""
    if kind == FIRST_COMMIT:
        return FirstCommitWait(config, ledger, int(args["instance_id"]))
    if kind == READY:
        return FirstCommitWait(config, ledger, int(args["instance_id"]), reached=FirstCommitWait.WARM)
    if kind == CAUGHT_UP:
        return CaughtUpWait(
            config, ledger, int(args["instance_id"]), int(args["max_lag"]), dict(args["handoff"])
        )
    if kind == DRAINED:
        return DrainedWait(ledger, int(args["instance_id"]))
    if kind == DRIVERS_STOPPED:
        return DriversStoppedWait(config, ledger, [int(i) for i in args["instance_ids"]])
    if kind == ONLY_APPS:
        return OnlyAppsWait(config, [str(n) for n in args["names"]])
    raise OperationError(f"unknown wait {kind!r}; one of {WAITS}")


def wait_in_process(wait: Wait, timeout_s: float, what: str, poll_s: float = 0.5) -> dict[str, Any]:
    """The CLI's way: poll here until the condition holds; WaitTimeout naming ``what`` on timeout."""
    done = poll(
        wait.check,
        timeout_s,
        poll_s,
        on_timeout=lambda: WaitTimeout(f"{what} did not happen within {timeout_s:.0f}s"),
    )
    assert done is not None  # poll raises on timeout
    return done
