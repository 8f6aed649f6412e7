"""The counter's sink (Relay's default pipeline): only canonical counters count, values byte for byte.

Batches go through the commit protocol as the pipeline driver runs them (``tests/counter_batches.py``)
on a SQLite ledger; the parser itself is ``relay.kafka.counter_key.parse_counter_bytes`` (``test_inputs``).
"""

from __future__ import annotations

from relay.audit import audit_ledger
from relay.ledger import schema as s
from relay.ledger.models import Color
from relay.ledger.store import Ledger
from relay.sinks.ledger_messages_tables import messages, value_text
from sqlalchemy import select

from tests.counter_batches import counted, counter_batch, row

T = "experience"
# What int() accepts but a counter is not (each one was counted before: int() strips and converts).
NOT_COUNTERS = [
    b" 42 ",
    b"43\n",
    b"+7",
    b"4_4",
    "٤٥".encode(),  # Arabic-Indic digits
    "४६".encode(),  # Devanagari digits
    b"-0",
    b"007",
    b"9" * 50,
    b"\xff\xfe",  # not UTF-8 at all
    b"",
]


def attempt(ledger: Ledger):
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, "p", "v1", Color.BLUE, "/nonexistent", "relay-p")
        if not ledger.take_over(conn, "p", inst):
            ledger.open_lease(conn, inst, T, 0, 0)
    return ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))


def test_non_canonical_keys_are_dead_letters_with_their_exact_bytes(ledger: Ledger) -> None:
    att = attempt(ledger)
    records = [row(T, 0, 0, b"0", b"0")]
    records += [row(T, 0, i + 1, key, key) for i, key in enumerate(NOT_COUNTERS)]
    end = len(records) + 1
    records.append(row(T, 0, end - 1, b"12", b"12"))
    result = counter_batch(ledger, att, 0, None, {T: {0: end}}, records)
    assert (result.rows_read, result.rows_applied) == (len(NOT_COUNTERS) + 2, 2)
    assert counted(ledger, "p") == 2 and ledger.dead_letter_count("p") == len(NOT_COUNTERS)
    with ledger.tx() as conn:
        applied = conn.execute(select(messages.c.offset, messages.c.key).order_by(messages.c.offset)).all()
        dead = conn.execute(
            select(
                s.dead_letters.c.offset, s.dead_letters.c.key, s.dead_letters.c.value, s.dead_letters.c.error
            )
        ).all()
    assert [tuple(r) for r in applied] == [(0, "0"), (end - 1, "12")]
    assert sorted((o, bytes(k), bytes(v)) for o, k, v, _ in dead) == [
        (i + 1, key, key) for i, key in enumerate(NOT_COUNTERS)
    ]
    assert all(e.startswith("ValueError: ") and "not a canonical counter" in e for *_, e in dead)
    report = audit_ledger(ledger, "p", T, lambda: ({0: 0}, {0: end}))
    assert report.ok, report.to_json()


VALUES = [
    (b"5", "5"),
    ("é€𝄞".encode(), "é€𝄞"),
    (b"\xff\xfe\x00binary", None),  # not UTF-8: no replacement characters, only the bytes
    (b"ab\x00cd", None),  # UTF-8, but PostgreSQL text cannot hold NUL
    (b"\xc3(", None),  # a truncated sequence
    (b"", ""),
    (None, None),
]


def test_values_are_stored_byte_for_byte_and_as_text_only_when_exact(ledger: Ledger) -> None:
    att = attempt(ledger)
    records = [{**row(T, 0, i), "value": value} for i, (value, _) in enumerate(VALUES)]
    counter_batch(ledger, att, 0, None, {T: {0: len(VALUES)}}, records)
    with ledger.tx() as conn:
        rows = conn.execute(
            select(messages.c.value, messages.c.value_bytes).order_by(messages.c.offset)
        ).all()
    assert [(None if b is None else bytes(b), t) for t, b in rows] == VALUES
    assert all("\ufffd" not in (t or "") for t, _ in rows)


def test_value_text_is_exact_or_none() -> None:
    assert [value_text(v) for v, _ in VALUES] == [t for _, t in VALUES]
