"""The reference job's parser and sink: only canonical counters count, values are kept byte for byte.

Batches go through the real commit protocol on a SQLite ledger; the schema migration to v3
(``messages.value_bytes``) is run on a ledger built as v2 left it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from relay.audit import audit_ledger
from relay.ledger import schema as s
from relay.ledger.models import Color
from relay.ledger.store import Ledger
from relay.protocol import Record, commit_batch
from relay.reference_sink import ReferenceSink, parse_counter, value_text
from sqlalchemy import create_engine, select, text

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


@pytest.mark.parametrize(("key", "n"), [(b"0", 0), (b"7", 7), (b"1234567890", 1234567890)])
def test_canonical_counters_parse(key: bytes, n: int) -> None:
    assert parse_counter(Record(T, 0, 0, key, key)) == n


@pytest.mark.parametrize("key", [*NOT_COUNTERS, None], ids=repr)
def test_every_other_key_is_poison_naming_its_bytes(key: bytes | None) -> None:
    with pytest.raises(ValueError) as caught:
        parse_counter(Record(T, 0, 0, key, b"x"))
    message = str(caught.value)
    assert "\n" not in message and "\x00" not in message
    assert (repr(key)[:20] in message) if key is not None else "no key" in message


def test_non_canonical_keys_are_dead_letters_with_their_exact_bytes(ledger: Ledger) -> None:
    att = attempt(ledger)
    records = [Record(T, 0, 0, b"0", b"0")]
    records += [Record(T, 0, i + 1, key, key) for i, key in enumerate(NOT_COUNTERS)]
    end = len(records) + 1
    records.append(Record(T, 0, end - 1, b"12", b"12"))
    result = commit_batch(ledger, att, 0, None, {T: {0: end}}, records, ReferenceSink("v1"))
    assert (result.rows_applied, result.dead_letters) == (2, len(NOT_COUNTERS))
    assert ledger.message_count("p") == 2
    with ledger.tx() as conn:
        applied = conn.execute(
            select(s.messages.c.offset, s.messages.c.key).order_by(s.messages.c.offset)
        ).all()
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
    records = [Record(T, 0, i, str(i).encode(), value) for i, (value, _) in enumerate(VALUES)]
    commit_batch(ledger, att, 0, None, {T: {0: len(VALUES)}}, records, ReferenceSink("v1"))
    with ledger.tx() as conn:
        rows = conn.execute(
            select(s.messages.c.value, s.messages.c.value_bytes).order_by(s.messages.c.offset)
        ).all()
    assert [(None if b is None else bytes(b), t) for t, b in rows] == VALUES
    assert all("\ufffd" not in (t or "") for t, _ in rows)


def test_value_text_is_exact_or_none() -> None:
    assert [value_text(v) for v, _ in VALUES] == [t for _, t in VALUES]


def test_a_v2_ledger_is_migrated_to_v3_keeping_its_rows(tmp_path: Path) -> None:
    """As a v2 ledger looks: no ``value_bytes``, version 2; old rows keep their text, new ones get bytes."""
    url = f"sqlite:///{tmp_path / 'v2.db'}"
    Ledger(url, create=True).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE messages DROP COLUMN value_bytes"))
        conn.execute(text("UPDATE relay_schema SET version = 2"))
        conn.execute(
            text(
                'INSERT INTO messages (pipeline, topic, partition, "offset", key, value, instance_id, '
                "version, batch_id) VALUES ('p', :t, 0, 0, '0', '0', 1, 'v1', 0)"
            ),
            {"t": T},
        )
    engine.dispose()

    ledger = Ledger(url)
    att = attempt(ledger)
    commit_batch(ledger, att, 0, None, {T: {0: 2}}, [Record(T, 0, 1, b"1", b"\xff1")], ReferenceSink("v1"))
    with ledger.tx() as conn:
        assert conn.execute(select(s.schema_version.c.version)).scalar() == s.SCHEMA_VERSION  # v3 and later
        rows = conn.execute(
            select(s.messages.c.value, s.messages.c.value_bytes).order_by(s.messages.c.offset)
        ).all()
    ledger.close()
    assert [(t, None if b is None else bytes(b)) for t, b in rows] == [("0", None), (None, b"\xff1")]
