"""The master's applications of a pipeline, each filed by what the ledger says of it.

Kept apart from the single-instance finding's judgements: naming which application belongs to which
instance (and which to another pipeline whose name extends ours) is a rule of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relay.ledger.models import Attempt, Instance
from relay.operations.inventory import Inventory
from relay.spark.launcher import app_prefix
from relay.spark.rest import SparkApp

STOPPING_GRACE_S = 120.0  # an application still listed this long after `relay stop` is a zombie


def instance_of_app(pipeline: str, name: str) -> int | None:
    """Instance id an application name ``relay-<pipeline>-<id>`` stands for; None if it is not ours.

    A bare prefix match is not enough: the prefix of pipeline ``exp`` also matches ``relay-exp-foo-3``.
    """
    rest = name[len(app_prefix(pipeline)) :] if name.startswith(app_prefix(pipeline)) else ""
    return int(rest) if rest.isdigit() else None


@dataclass
class Apps:
    """The master's applications of the pipeline, sorted by what the ledger says of each."""

    unknown: list[SparkApp] = field(default_factory=list)  # no instance of that id in the ledger
    impostors: list[SparkApp] = field(default_factory=list)  # a live instance's name, no recorded attempt
    zombies: list[tuple[SparkApp, Instance]] = field(default_factory=list)  # of an ended instance
    stopping: list[SparkApp] = field(default_factory=list)  # finishing after `relay stop`
    problems: list[str] = field(default_factory=list)  # one per finding, in the master's order

    @property
    def not_ours(self) -> list[SparkApp]:
        """Applications Relay did not start (the ledger's unknown ones, then the impostors)."""
        return self.unknown + self.impostors


def is_ours(pipeline: str, name: str) -> bool:
    """Named after this pipeline, and not after another whose name extends it (``relay-exp-foo-3`` is
    pipeline ``exp-foo``'s instance 3, not an unknown application of pipeline ``exp``)."""
    prefix = app_prefix(pipeline)
    if not name.startswith(prefix):
        return False
    if instance_of_app(pipeline, name) is not None:
        return True
    head, _, tail = name[len(prefix) :].rpartition("-")
    return not (head and tail.isdigit())


def impostor(app: SparkApp, owner: Instance, attempts: list[Attempt]) -> str | None:
    """The problem when ``app`` runs under live ``owner``'s name but no attempt recorded its id: a copy
    Relay did not start. None for a recorded one, or while the current attempt's session is still being
    built (its application id is not known yet)."""
    recorded = {a.app_id for a in attempts if a.app_id}
    current = [a for a in attempts if a.epoch == owner.current_epoch]
    starting = bool(current) and current[-1].app_id is None
    if app.id in recorded or starting:
        return None
    return (
        f"Spark application {app.id} runs under instance {owner.id}'s name ({app.name}) but "
        f"is not an attempt Relay recorded (current: "
        f"{current[-1].app_id if current else 'none'}): a copy Relay did not start"
    )


def _sort_app(
    apps: Apps,
    app: SparkApp,
    inst_id: int | None,
    live: list[Instance],
    by_id: dict[int, Instance],
    attempts: dict[int, list[Attempt]],
    now: float,
) -> None:
    """File one application of ours: a live instance's (recorded, or an impostor), an instance the
    ledger does not know, one still finishing after `relay stop`, or a zombie of an ended instance."""
    owner = next((i for i in live if i.id == inst_id), None)
    if owner is not None:
        problem = impostor(app, owner, attempts.get(owner.id, []))
        if problem:
            apps.impostors.append(app)
            apps.problems.append(problem)
        return
    inst = by_id.get(inst_id) if inst_id is not None else None
    if inst is None:
        apps.unknown.append(app)
        apps.problems.append(
            f"Spark application {app.id} ({app.name}) runs but the ledger knows no such instance "
            "(started behind Relay's back?)"
        )
    elif inst.stop_requested and now - inst.updated_at < STOPPING_GRACE_S:
        apps.stopping.append(app)  # `relay stop` ended it a moment ago: its application is finishing
    else:
        apps.zombies.append((app, inst))
        apps.problems.append(
            f"instance {inst.id} is {inst.state.value} in the ledger but still runs in the master "
            f"as {app.id} ({app.name})"
        )


def sort_apps(
    pipeline: str,
    apps: list[SparkApp],
    live: list[Instance],
    by_id: dict[int, Instance],
    attempts: dict[int, list[Attempt]],
    now: float,
) -> Apps:
    """The master's applications of ``pipeline``, each filed once (:func:`_sort_app`)."""
    sorted_apps = Apps()
    for app in apps:
        if is_ours(pipeline, app.name):
            _sort_app(sorted_apps, app, instance_of_app(pipeline, app.name), live, by_id, attempts, now)
    return sorted_apps


def other_drivers(
    inventory: Inventory, instances: list[Instance], attempts: dict[int, list[Attempt]]
) -> list[dict[str, Any]]:
    """The master's drivers that no instance or attempt of the pipeline recorded."""
    known = {i.submission_id for i in instances if i.submission_id} | {
        a.driver_id for atts in attempts.values() for a in atts if a.driver_id
    }
    return [
        {"id": d.id, "state": d.state.value, "worker": d.worker}
        for d in inventory.drivers
        if d.id not in known
    ]
