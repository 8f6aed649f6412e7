"""The key of the counter's records (Relay's default pipeline, the seeds' job): a canonical decimal.

Why strict: a key the producer writes and the counter sink parses must mean one number only.
"""

from __future__ import annotations

import re

from relay.config.inputs import short_repr

#: A counter (the seeds' counter's key) in its one canonical form: ASCII ``0`` or ``[1-9][0-9]*``, no
#: sign, space, underscore or other digits, and at most 2^63-1 (Spark's LongType, PostgreSQL BIGINT).
#: ``int()`` is far more lenient (`` 42 ``, ``+7``, ``4_4``, ``٤٢``, ``-0``): never parse counters with it.
COUNTER_MAX = 2**63 - 1
_COUNTER = re.compile(rb"0|[1-9][0-9]{0,18}")


def parse_counter_bytes(raw: bytes | None) -> int:
    """The counter ``raw`` holds in canonical form; ValueError (naming the bytes) for anything else."""
    if raw is None:
        raise ValueError("message has no key")
    if not _COUNTER.fullmatch(raw) or int(raw) > COUNTER_MAX:
        raise ValueError(
            f"key {short_repr(raw)} is not a canonical counter (ASCII 0 or 1-9 then digits, at most 2^63-1)"
        )
    return int(raw)
