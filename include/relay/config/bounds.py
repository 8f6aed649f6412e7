"""The largest values Relay accepts for its numbers, in one place (issue #34: a count of 10**22 records
and ``RELAY_TRIGGER_SECONDS=1e309`` were accepted; the second reached PostgreSQL's JSON as Infinity).

Each bound is far above any sensible setting and far below what breaks something downstream
(PostgreSQL's bigint, JSON's finite numbers, a wait a person would still be waiting for).
"""

from __future__ import annotations

import math

MAX_TRIGGER_S = 3600.0  # an hour between micro-batches
MAX_OFFSETS_PER_TRIGGER = 100_000_000
MAX_RECORDS = 1_000_000_000  # records one `relay produce` sends
MAX_RATE = 10_000_000.0  # records per second
MAX_SECONDS = 7 * 86_400.0  # any wait or timeout: a week
MAX_PORT = 65_535
MAX_PARTITIONS = 100_000
MAX_CORES = 4096
MAX_LAG = 10**15  # records


def finite_between(value: float, low: float, high: float) -> bool:
    """True for a finite number in ``[low, high]`` (NaN and infinities never are)."""
    return math.isfinite(value) and low <= value <= high
