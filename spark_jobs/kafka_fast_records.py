"""Kafka records decoded straight into ``(offset, timestamp, timestamp_type, key, value)`` tuples.

Why: kafka-python turns every record into a ``DefaultRecord`` and then a 13-field ``ConsumerRecord``
through seven ``decode_varint`` calls, two deserializer calls and a header-size sum; the source needs
five fields. Measured on one core, 100-byte JSON values: that per-record path was most of the reader's
CPU. Here one loop per record batch decodes the fields the source uses and skips the headers by the
record's length.

Only the per-record step changes: :func:`fast_partition_records` subclasses the pinned kafka-python's
``Fetcher.PartitionRecords`` and keeps its batch-level rules word for word (CRC check, aborted
transactions under read_committed, control batches, the next fetch offset, compaction holes). A batch
in the old message formats (magic 0/1) goes through kafka-python's own records. :func:`install` puts it
on one consumer, and only where that consumer's fetcher has the shape it was written against.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

#: One record as the source reads it: offset, timestamp (ms), timestamp type, key, value.
FastRecord = tuple[int, int, int, bytes | None, bytes | None]

_SHAPE = ("PartitionRecords", "_parse_fetched_data")
_RECORDS_SHAPE = ("_unpack_records", "_maybe_skip_record", "_consume_aborted_transactions_up_to")
_CLASSES: dict[type, type] = {}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos``: (value, next position); one byte without a loop."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint out of int64 range")


def decode_v2(
    data: bytes, pos: int, count: int, base_offset: int, base_ts: int, ts_type: int, log_append_ts: int
) -> list[FastRecord]:
    """The ``count`` records of one (uncompressed) v2 batch body starting at ``pos``.

    ``log_append_ts`` >= 0: every record's timestamp is the batch's max timestamp (LogAppendTime).
    Raises ValueError when a record's fields don't add up to its length or bytes are left over.
    """
    out: list[FastRecord] = []
    append = out.append
    varint = _varint
    for _ in range(count):
        length, pos = varint(data, pos)
        end = pos + length
        ts_delta, pos = varint(data, pos + 1)  # after the attributes byte, unused
        off_delta, pos = varint(data, pos)
        n, pos = varint(data, pos)
        key = data[pos : pos + n] if n >= 0 else None
        pos += max(n, 0)
        n, pos = varint(data, pos)
        value = data[pos : pos + n] if n >= 0 else None
        pos += max(n, 0)
        if pos > end or end > len(data):
            raise ValueError(f"record at offset {base_offset + off_delta} overruns its length {length}")
        ts = log_append_ts if log_append_ts >= 0 else base_ts + ts_delta
        append((base_offset + off_delta, ts, ts_type, key, value))
        pos = end  # the headers, which the source does not read
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} unconsumed bytes after the batch's {count} records")
    return out


def _batch_records(batch: Any) -> list[FastRecord]:
    """One kafka-python ``DefaultRecordBatch``'s records (decompressed by kafka-python's codecs)."""
    batch._maybe_uncompress()  # the pinned kafka-python's codec step, reused
    data = bytes(batch._buffer)  # one copy per batch: slices are then plain bytes
    ts_type = batch.timestamp_type
    log_append = batch.max_timestamp if ts_type == batch.LOG_APPEND_TIME else -1
    start = batch._pos  # after the header, or 0 once decompressed
    return decode_v2(
        data, start, batch.records_count, batch.base_offset, batch.first_timestamp, ts_type, log_append
    )


def fast_partition_records(base: type) -> type:
    """``base`` (kafka-python's ``Fetcher.PartitionRecords``) with its per-record step replaced."""
    cls = _CLASSES.get(base)
    if cls is not None:
        return cls

    class FastPartitionRecords(base):  # type: ignore[misc,valid-type]
        """Yields :data:`FastRecord` tuples; the batch rules are kafka-python 3.0's."""

        def _maybe_skip_record(self, record: Any) -> bool:
            return record[0] < self.fetch_offset

        def _unpack_records(
            self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
        ) -> Iterator[Any]:
            import kafka.errors as errors
            from kafka.protocol.consumer import IsolationLevel

            if key_deserializer is not None or value_deserializer is not None:
                yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
                return
            batch = records.next_batch()
            last_batch = None
            while batch is not None:
                last_batch = batch
                if self.check_crcs and not batch.validate_crc():
                    raise errors.CorruptRecordError(
                        f"Record batch for partition {self.topic_partition} at offset {batch.base_offset} "
                        "failed crc check"
                    )
                if batch.magic != 2:  # old formats: kafka-python's records and CRCs, as tuples
                    for record in batch:
                        if self.check_crcs and not record.validate_crc():
                            raise errors.CorruptRecordError(
                                f"Record for partition {self.topic_partition} at offset {record.offset} "
                                "failed crc check"
                            )
                        self.records_read += 1
                        self.bytes_read += record.size_in_bytes
                        self.next_fetch_offset = record.offset + 1
                        yield (
                            record.offset,
                            record.timestamp,
                            record.timestamp_type,
                            record.key,
                            record.value,
                        )
                    batch = records.next_batch()
                    continue
                self.leader_epoch = batch.leader_epoch
                if self.isolation_level == IsolationLevel.READ_COMMITTED and batch.has_producer_id():
                    self._consume_aborted_transactions_up_to(batch.last_offset)
                    if self._contains_abort_marker(batch):
                        self.aborted_producer_ids.discard(batch.producer_id)
                    elif self._is_batch_aborted(batch):
                        self.next_fetch_offset = batch.next_offset
                        batch = records.next_batch()
                        continue
                if batch.is_control_batch:
                    self.next_fetch_offset = batch.next_offset
                    batch = records.next_batch()
                    continue
                try:
                    decoded = _batch_records(batch)
                except (ValueError, IndexError) as err:
                    raise errors.CorruptRecordError(f"Found invalid record structure: {err!r}") from None
                self.records_read += len(decoded)
                self.bytes_read += batch.size_in_bytes
                for record in decoded:
                    self.next_fetch_offset = record[0] + 1
                    yield record
                batch = records.next_batch()
            if last_batch is not None and last_batch.magic == 2:
                # v2 keeps the last offset of a batch whose last records were compacted away
                self.next_fetch_offset = last_batch.next_offset
            self.drain()

    _CLASSES[base] = FastPartitionRecords
    return FastPartitionRecords


def install(consumer: Any) -> bool:
    """Make ``consumer``'s polls return :data:`FastRecord` tuples; False (nothing changed) where its
    fetcher is not the shape this module was written against."""
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(type(fetcher), "PartitionRecords", None)
    if fetcher is None or base is None or not all(hasattr(fetcher, a) for a in _SHAPE):
        log.info("kafka-python's fetcher has another shape: records decoded by kafka-python")
        return False
    if not all(hasattr(base, a) for a in _RECORDS_SHAPE):
        log.info("kafka-python's PartitionRecords has another shape: records decoded by kafka-python")
        return False
    fetcher.PartitionRecords = fast_partition_records(base)
    return True
