"""What the Kafka source asks the ledger before planning a batch: may it read, and up to where.

The source caps an instance's reads at the end of its leases (blue stops reading at the handoff
offset H) and plans no new batch once a stop is requested, so a graceful stop lands between batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.ledger.store import Ledger

_ledgers: dict[str, Ledger] = {}


@dataclass(frozen=True)
class SourceGuard:
    stop_requested: bool
    caps: dict[str, dict[int, int]] = field(default_factory=dict)
    """topic -> partition -> exclusive highest offset the instance may read; missing = uncapped."""


def read_source_guard(ledger_url: str, instance_id: int) -> SourceGuard:
    ledger = _ledgers.get(ledger_url)
    if ledger is None:
        ledger = _ledgers[ledger_url] = Ledger(ledger_url)
    with ledger.tx() as conn:
        instance = ledger.instance(instance_id, conn)
        leases = ledger.leases(instance_id, conn)
    stop = instance.stop_requested or not instance.state.live
    ends: dict[tuple[str, int], list[int | None]] = {}
    for lease in leases:
        ends.setdefault((lease.topic, lease.partition), []).append(lease.end_offset)
    caps: dict[str, dict[int, int]] = {}
    for (topic, partition), lease_ends in ends.items():
        if all(e is not None for e in lease_ends):
            caps.setdefault(topic, {})[partition] = max(e for e in lease_ends if e is not None)
    return SourceGuard(stop_requested=stop, caps=caps)
