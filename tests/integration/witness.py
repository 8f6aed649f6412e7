"""Outside witnesses: read what a sink holds with a client Relay does not write with.

Relay's Kafka sink writes with kafka-python; the witness reads the output with confluent-kafka
(librdkafka), ``isolation.level=read_committed``, every partition from its beginning to its last
stable offset. An aborted or still-open transaction's records must be invisible; what is visible is
what a downstream consumer gets. Tables are read with plain SQL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from relay_dev.witness import OutputRecord, read_committed

__all__ = ["OutputRecord", "exactly_once", "input_positions", "read_committed"]


def exactly_once(records: Iterable[OutputRecord], expected: Iterable[tuple[str, int, int]]) -> None:
    """Every expected input position has exactly one output record, and nothing else was written:
    the check a downstream consumer would make, with the offsets named when it fails."""
    seen = Counter(r.source for r in records)
    want = set(expected)
    twice = sorted(s for s, c in seen.items() if c > 1 and s is not None)
    missing = sorted(want - set(seen))
    extra = sorted((s for s in seen if s not in want), key=str)
    assert (twice, missing, extra) == ([], [], []), (
        f"duplicates {twice[:10]} ({len(twice)}), missing {missing[:10]} ({len(missing)}), "
        f"unexpected {extra[:10]} ({len(extra)})"
    )


def input_positions(
    bootstrap: str, topic: str, keep: Callable[[bytes | None, bytes | None], bool], timeout_s: float = 120.0
) -> set[tuple[str, int, int]]:
    """The input positions whose record ``keep`` accepts (what the transform should write)."""
    records = read_committed(bootstrap, topic, timeout_s)
    return {(topic, r.partition, r.offset) for r in records if keep(r.key, r.value)}
