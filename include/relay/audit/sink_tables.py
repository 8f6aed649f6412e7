"""PostgreSQL upsert tables judged key by key (pure: no database, no Spark here).

Upsert (``PostgresUpsertSink``): the sink keeps, per key, the row of the newest source position
(topic bytewise, then partition, then offset), so after every applied offset the stored row must be
the newest row the transform makes from the applied input: same position, same values. A row with an
older position is stale, a key without a row is missing; a row whose position no applied record
explains is wrong, unless the ledger has not committed it yet (ahead) or its input is gone
(unverified); a row without a position was written outside Relay (foreign).

Stateful (``stateful=True``): rows carry the writer's position (``relay-state``, generation = lease
id, batch), not the records'; each group's stored values must equal the transform evaluated as a
batch query over the input, by the version that wrote the row (the newest version for a group not
stored). Groups that still received records near the end of the input may differ while the
pipeline runs ("open"); groups fed by records near a retention boundary are "unverified".
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from relay.audit.sink_report import SinkAudit

Key = tuple[Any, ...]
Position = tuple[bytes, int, int]  # (topic as UTF-8 bytes, partition, offset): the sink's order
Values = tuple[Any, ...]


def norm(value: Any) -> Any:
    """A value as PostgreSQL gives it back and as Spark gives it, made comparable."""
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.12g}")  # float4 columns, decimal text round trips
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)  # the evaluation's session time zone is UTC
    if isinstance(value, list | tuple):
        return tuple(norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), norm(v)) for k, v in value.items()))
    return value


def row(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(norm(v) for v in values)


@dataclass
class NewestRows:
    """Per key, the newest position the transform's output holds, and the values there (several
    rows of one key at one position: any of them is what the sink may keep)."""

    rows: dict[Key, tuple[Position, set[Values]]] = field(default_factory=dict)

    def add(self, key: Key, position: Position, values: Values) -> None:
        held = self.rows.get(key)
        if held is None or held[0] < position:
            self.rows[key] = (position, {values})
        elif held[0] == position:
            held[1].add(values)


def position(topic: str | None, partition: int | None, offset: int | None) -> Position | None:
    if topic is None or partition is None or offset is None:
        return None
    return (topic.encode(), int(partition), int(offset))


def shown(key: Key) -> str:
    return ",".join(str(k) for k in key)


def compare_upsert(
    topic: str,
    newest: NewestRows,
    stored: Iterable[tuple[Key, Values, Position | None]],
    state: Callable[[int, int], str],
    audit: SinkAudit,
) -> None:
    """Judge every stored row, then count expected keys with no row as missing.

    ``state(partition, offset)`` says what the ledger and Kafka know of an input position no expected
    row explains: "applied" (evaluated: its output has no row of this key), "ahead" or "unverified".
    """
    name = topic.encode()
    for key, values, pos in stored:
        want = newest.rows.pop(key, None)
        at = None if pos is None else f"{pos[0].decode(errors='replace')}:{pos[1]}:{pos[2]}"
        if pos is None or pos[0] != name:
            if want is None:
                audit.add("foreign", shown(key))
            else:
                audit.add("stale", {"key": shown(key), "stored": at, "expected": _at(want[0])})
        elif want is not None and pos == want[0]:
            if values in want[1]:
                audit.add("ok")
            else:
                audit.add("wrong", {"key": shown(key), "at": at, "why": "values"})
        elif want is not None and pos < want[0]:
            audit.add("stale", {"key": shown(key), "stored": at, "expected": _at(want[0])})
        else:  # a position newer than any applied record of this key, or none expected at all
            found = state(pos[1], pos[2])
            if found == "applied":
                audit.add("wrong", {"key": shown(key), "at": at, "why": "not in the transform's output"})
            else:
                audit.add(found, {"key": shown(key), "at": at})
    for key, (pos, _) in sorted(newest.rows.items(), key=lambda kv: kv[1][0]):
        audit.add("missing", {"key": shown(key), "expected": _at(pos)})
    newest.rows.clear()


def _at(pos: Position) -> str:
    return f"{pos[0].decode(errors='replace')}:{pos[1]}:{pos[2]}"


def compare_groups(
    stored: Iterable[tuple[Key, Values, int | None]],
    expected: Mapping[str, Mapping[Key, Values]],
    generation_version: Callable[[int], str | None],
    newest: str,
    audit: SinkAudit,
    *,
    open_keys: frozenset[Key] = frozenset(),
    edge_keys: frozenset[Key] = frozenset(),
) -> list[Key]:
    """Judge stateful groups; returns the keys that differ (before ``open_keys``/``edge_keys`` are
    known, the caller may evaluate those and judge again)."""
    differ: list[Key] = []
    seen: set[Key] = set()

    def off(key: Key, finding: str, detail: dict[str, Any]) -> None:
        differ.append(key)
        if key in open_keys:
            audit.add("open", shown(key))
        elif key in edge_keys:
            audit.add("unverified", shown(key))
        else:
            audit.add(finding, {"group": shown(key), **detail})

    for key, values, generation in stored:
        seen.add(key)
        version = generation_version(generation) if generation is not None else None
        want = expected.get(version or newest, expected.get(newest, {})).get(key)
        if want == values:
            audit.add("ok")
        elif want is None:
            off(key, "wrong", {"stored": list(values), "why": "no such group in the transform's output"})
        else:
            off(key, "wrong", {"stored": list(values), "expected": list(want)})
    for key in sorted(set(expected.get(newest, {})) - seen, key=repr):
        off(key, "missing", {"expected": list(expected[newest][key])})
    return differ
