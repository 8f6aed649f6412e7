"""The source's record decoder (``kafka_fast_records``) against kafka-python's own, record for record.

The fast path replaces only kafka-python's per-record step; every case here runs the same fetched
bytes through kafka-python's ``PartitionRecords`` and through the fast subclass and wants the same
records and the same next fetch offset: compression, headers, NULL keys and values, LogAppendTime, a
fetch starting inside a batch, control batches, and aborted transactions under read_committed.
"""

from __future__ import annotations

import json
import struct
from collections import namedtuple
from typing import Any

import kafka_fast_records as fast
import pytest
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer import IsolationLevel
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c
from kafka.structs import TopicPartition

TP = TopicPartition("t", 0)
Aborted = namedtuple("Aborted", "producer_id first_offset")
ATTRIBUTES_AT, CRC_AT = 21, 17


def batch(
    base: int,
    n: int,
    compression: int = 0,
    headers: bool = False,
    producer_id: int = -1,
    log_append: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=producer_id >= 0,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=10**9,
    )
    for i in range(n):
        key = None if i % 7 == 0 else str(base + i).encode()
        value = None if i % 11 == 3 else json.dumps({"id": base + i, "name": "x" * (i % 300)}).encode()
        builder.append(
            i,
            timestamp=1_700_000_000_000 + i * 997,  # deltas from one byte to three
            key=key,
            value=value,
            headers=[("h", b"v" * (i % 5))] if headers else [],
        )
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    if log_append:
        _set_attributes(raw, 0x08)
    return bytes(raw)


def _set_attributes(raw: bytearray, bits: int) -> None:
    attributes = struct.unpack_from(">h", raw, ATTRIBUTES_AT)[0] | bits
    struct.pack_into(">h", raw, ATTRIBUTES_AT, attributes)
    struct.pack_into(">I", raw, CRC_AT, calc_crc32c(memoryview(raw)[ATTRIBUTES_AT:]))


def marker(base: int, producer_id: int, commit: bool) -> bytes:
    """A control batch: one record whose key says abort (0) or commit (1)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
        producer_epoch=0, base_sequence=-1, batch_size=10**9,
    )  # fmt: skip
    builder.append(
        0, timestamp=1_700_000_000_000, key=struct.pack(">hh", 0, int(commit)), value=b"", headers=[]
    )
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    _set_attributes(raw, 0x20)
    return bytes(raw)


def drained(
    cls: type, data: bytes, fetch_offset: int, aborted: list[Any] | None = None, step: int = 37
) -> Any:
    """Every record ``cls`` yields from ``data`` (taken ``step`` at a time, as polls do) and its
    next fetch offset afterwards."""
    committed = IsolationLevel.READ_COMMITTED if aborted is not None else IsolationLevel.READ_UNCOMMITTED
    part = cls(fetch_offset, TP, MemoryRecords(data), check_crcs=True, isolation_level=committed,
               aborted_transactions=aborted)  # fmt: skip
    out: list[tuple[Any, ...]] = []
    while part:
        taken = part.take(step)
        if not taken:
            break
        out += [
            r if type(r) is tuple else (r.offset, r.timestamp, r.timestamp_type, r.key, r.value)
            for r in taken
        ]
    return out, part.next_fetch_offset


FAST = fast.fast_partition_records(Fetcher.PartitionRecords)


@pytest.mark.parametrize("compression", [0, 1, 4], ids=["none", "gzip", "zstd"])
@pytest.mark.parametrize("headers", [False, True], ids=["no-headers", "headers"])
def test_the_fast_records_are_kafka_pythons(compression: int, headers: bool) -> None:
    data = batch(0, 300, compression, headers) + batch(300, 5, compression, headers, log_append=True)
    want = drained(Fetcher.PartitionRecords, data, 0)
    assert len(want[0]) == 305 and want[1] == 305
    assert drained(FAST, data, 0) == want


def test_a_fetch_inside_a_batch_starts_at_its_offset() -> None:
    data = batch(100, 50, compression=1) + batch(150, 50)
    want = drained(Fetcher.PartitionRecords, data, 123)
    assert want[0][0][0] == 123
    assert drained(FAST, data, 123) == want


def test_control_batches_and_aborted_transactions_are_skipped_under_read_committed() -> None:
    data = (
        batch(0, 10, producer_id=7)  # aborted
        + marker(10, 7, commit=False)
        + batch(11, 10, producer_id=8)  # committed
        + marker(21, 8, commit=True)
        + batch(22, 5)  # not transactional
    )
    aborted = [Aborted(producer_id=7, first_offset=0)]
    want = drained(Fetcher.PartitionRecords, data, 0, aborted)
    assert [r[0] for r in want[0]] == [*range(11, 21), *range(22, 27)]
    assert drained(FAST, data, 0, aborted) == want
    # read_uncommitted: the aborted records too, the markers never
    assert drained(FAST, data, 0) == drained(Fetcher.PartitionRecords, data, 0)


def test_a_record_overrunning_its_length_is_corrupt() -> None:
    raw = bytearray(batch(0, 3))
    # the first record's length (a zigzag varint after the 61-byte header) made 2 bytes shorter
    length = raw[61]
    raw[61] = length - 4 if length < 0x80 else length
    struct.pack_into(">I", raw, CRC_AT, calc_crc32c(memoryview(raw)[ATTRIBUTES_AT:]))
    with pytest.raises(CorruptRecordError):
        drained(FAST, bytes(raw), 0)
    with pytest.raises(ValueError):
        fast.decode_v2(bytes(raw), 61, 3, 0, 0, 0, -1)


def test_install_refuses_a_consumer_of_another_shape() -> None:
    class Other:
        _fetcher = object()

    assert fast.install(Other()) is False
    assert fast.install(object()) is False


def test_a_corrupt_batch_fails_its_crc() -> None:
    raw = bytearray(batch(0, 20))
    raw[-3] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        drained(FAST, bytes(raw), 0)
    assert DefaultRecordBatch(bytes(batch(0, 2))).validate_crc()


def test_a_batch_whose_last_records_were_compacted_away_moves_the_fetch_past_them() -> None:
    raw = bytearray(batch(40, 10))
    struct.pack_into(">i", raw, 23, 14)  # lastOffsetDelta: offsets 50-54 compacted away
    struct.pack_into(">I", raw, CRC_AT, calc_crc32c(memoryview(raw)[ATTRIBUTES_AT:]))
    want = drained(Fetcher.PartitionRecords, bytes(raw), 40)
    assert want[1] == 55 and len(want[0]) == 10
    assert drained(FAST, bytes(raw), 40) == want


def legacy(n: int) -> bytes:
    """Message format v1 (magic 1): one CRC per record, no record batch."""
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=10**9)
    for i in range(n):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=str(i).encode(), value=b"v%d" % i)
    return bytes(builder.build())


def test_old_format_records_are_kafka_pythons_and_keep_their_crc_check() -> None:
    data = legacy(30)
    want = drained(Fetcher.PartitionRecords, data, 0)
    assert [r[0] for r in want[0]] == list(range(30))
    assert drained(FAST, data, 0) == want
    raw = bytearray(data)
    raw[-1] ^= 0xFF  # the last record's value: its own CRC no longer matches
    for cls in (Fetcher.PartitionRecords, FAST):
        with pytest.raises(CorruptRecordError):
            drained(cls, bytes(raw), 0)
