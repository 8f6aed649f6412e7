"""The counter's sink on a PostgreSQL ledger: values PostgreSQL text cannot hold are kept as bytes.

A value with a NUL byte (valid UTF-8) once failed the whole batch on PostgreSQL ("A string literal
cannot contain NUL"), so one such record stopped the pipeline; non-UTF-8 values were stored with
replacement characters. The batch runs as the pipeline driver runs it (``tests/counter_batches.py``).
"""

from __future__ import annotations

import uuid

import pytest
from relay.ledger import schema as s
from relay.ledger.models import Color
from relay.ledger.store import Ledger
from relay.sinks.ledger_messages import dispose_engines
from relay.sinks.ledger_messages_tables import messages
from sqlalchemy import select

from tests.counter_batches import counter_batch, row

pytestmark = pytest.mark.integration

VALUES = [b"0", b"ab\x00cd", b"\xff\xfe\x00binary", "é€".encode(), None, b" 5 "]


def test_values_round_trip_byte_for_byte_on_postgres(postgres_url: str) -> None:
    pipeline, topic = f"b{uuid.uuid4().hex[:8]}", "bytes"
    ledger = Ledger(postgres_url, create=True)
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "v1", Color.BLUE, "/nonexistent", f"relay-{pipeline}")
        if not ledger.take_over(conn, pipeline, inst):
            ledger.open_lease(conn, inst, topic, 0, 0)
    att = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    records = [{**row(topic, 0, i), "value": v} for i, v in enumerate(VALUES)]
    records.append(row(topic, 0, len(VALUES), b"\x00", b"\x00"))  # poison with a NUL key
    result = counter_batch(ledger, att, 0, None, {topic: {0: len(records)}}, records)
    dispose_engines()
    assert (result.rows_read, result.rows_applied) == (len(VALUES) + 1, len(VALUES))
    m, d = messages, s.dead_letters
    with ledger.tx() as conn:
        rows = conn.execute(
            select(m.c.value, m.c.value_bytes).where(m.c.pipeline == pipeline).order_by(m.c.offset)
        ).all()
        dead = conn.execute(select(d.c.key, d.c.error).where(d.c.pipeline == pipeline)).one()
    ledger.close()
    assert [None if b is None else bytes(b) for _, b in rows] == VALUES
    assert [t for t, _ in rows] == ["0", None, None, "é€", None, " 5 "]
    assert bytes(dead[0]) == b"\x00" and "\x00" not in dead[1]
