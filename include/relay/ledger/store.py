"""The ledger: instances, attempts with epochs, offset-range leases, gaps, on SQLite or PostgreSQL.

Every write that decides correctness happens in one transaction that first locks the instance row
(``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so fencing, epochs and
cursor moves are serialised per instance. One domain per module: ``base`` (connection, instances),
``attempts``, ``leases``, ``records`` (batches, reports, operations).
"""

from __future__ import annotations

from relay.ledger.attempts import DRIVER_ALIVE_S, AttemptsMixin
from relay.ledger.base import ledger_error, token_hash
from relay.ledger.leases import LeasesMixin
from relay.ledger.records import RecordsMixin

__all__ = ["DRIVER_ALIVE_S", "Ledger", "ledger_error", "token_hash"]


class Ledger(AttemptsMixin, LeasesMixin, RecordsMixin):
    """Access to one ledger database. Cheap to create; connects lazily through a pooled engine."""
