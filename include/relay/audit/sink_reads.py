"""Reading a sink independently of how Relay wrote it: a Kafka output topic, an upsert table.

Kafka: a consumer of its own with the sink's client settings, ``read_committed`` (what downstream
consumers see: aborted transactions and markers are not records), every partition from its earliest
offset to its last stable offset at the start of the read. PostgreSQL: one read-only transaction,
streamed through a server-side cursor. Messages never carry a credential.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka import errors as kerrors

from relay.audit.sink_kafka import OutputRecord
from relay.audit.sink_report import SinkAuditError
from relay.audit.sink_tables import Key, Position, Values, position, row
from relay.sinks import pg_conn
from relay.sinks import pg_schema as ps
from relay.sinks.kafka_transactional import KafkaTransactionalSink
from relay.sinks.postgres_upsert import PostgresUpsertSink

POLL_MS = 500
STALL_S = 60.0
PROGRESS_EVERY_S = 5.0
FETCH_ROWS = 10_000
Progress = Callable[[str], None]


def output_records(
    sink: KafkaTransactionalSink, progress: Progress, starts: dict[int, int] | None = None
) -> Iterator[OutputRecord]:
    """Every committed record of the sink's topic, partition by partition; ``starts`` gets each
    partition's log start (above 0: retention or ``delete_records`` removed records before it)."""
    settings = sink.settings
    try:
        consumer = KafkaConsumer(**settings.consumer_config("read_committed"), client_id="relay-audit-sink")
    except kerrors.KafkaError as exc:
        raise SinkAuditError(
            f"cannot read the output topic {sink.topic!r}: {settings.scrub(str(exc))}"
        ) from None
    try:
        parts = sorted(consumer.partitions_for_topic(sink.topic) or ())
        if not parts:
            raise SinkAuditError(f"output topic {sink.topic!r} does not exist at {settings.servers}")
        tps = [TopicPartition(sink.topic, p) for p in parts]
        first, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)  # ends: the LSO
        if starts is not None:
            starts.update({tp.partition: first[tp] for tp in tps})
        total = sum(ends[tp] - first[tp] for tp in tps)
        progress(f"sink audit: reading output topic {sink.topic} ({total:,} offsets, read_committed)")
        done, said = 0, time.monotonic()
        for tp in tps:
            for record in _partition(consumer, tp, first[tp], ends[tp], settings.scrub):
                done += 1
                yield OutputRecord(tp.partition, record.offset, record.key, record.value, record.headers)
                if time.monotonic() - said >= PROGRESS_EVERY_S:
                    progress(f"sink audit: {done:,} output records read ({sink.topic}[{tp.partition}])")
                    said = time.monotonic()
    finally:
        consumer.close()


def _partition(
    consumer: KafkaConsumer, tp: TopicPartition, start: int, end: int, scrub: Callable[[str], str]
) -> Iterator[Any]:
    if end <= start:
        return
    consumer.assign([tp])
    consumer.seek(tp, start)
    position, moved = start, time.monotonic()
    while position < end:
        try:
            for record in consumer.poll(timeout_ms=POLL_MS).get(tp, []):
                if record.offset >= end:
                    return
                yield record
            now_at = consumer.position(tp)
        except kerrors.OffsetOutOfRangeError:
            raise SinkAuditError(
                f"{tp.topic}[{tp.partition}] lost offsets from {position} while the audit read them "
                "(retention): run the audit again"
            ) from None
        except kerrors.KafkaError as exc:
            raise SinkAuditError(f"reading {tp.topic}[{tp.partition}] failed: {scrub(str(exc))}") from None
        if now_at is not None and now_at > position:
            position, moved = now_at, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            raise SinkAuditError(
                f"reading {tp.topic}[{tp.partition}] made no progress at {position} (needed {end}) "
                f"for {STALL_S:.0f}s"
            )


def table_rows(
    sink: PostgresUpsertSink, columns: Sequence[str], progress: Progress
) -> Iterator[tuple[Key, Values, Position | None, int | None]]:
    """(key, values of the other columns, source position, stored partition) of every row."""
    import psycopg2
    from psycopg2 import sql

    url = sink._url  # the real URL, only handed to libpq (the sink's own ``url`` is masked)
    key = list(sink.key)
    rest = [c for c in columns if c not in key]
    cols = [*key, *rest, *ps.RELAY_COLUMNS]
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(map(sql.Identifier, cols)), ps.qualified(sink.schema, sink.table)
    )
    target = ps.shown(sink.schema, sink.table)
    try:
        conn = psycopg2.connect(pg_conn.libpq_url(url), connect_timeout=pg_conn.CONNECT_TIMEOUT_S)
    except psycopg2.Error as exc:
        raise SinkAuditError(
            f"cannot connect to {sink.url}: {pg_conn.scrub(str(exc).strip(), url)}"
        ) from None
    try:
        conn.set_session(readonly=True)
        progress(f"sink audit: reading table {target} at {sink.url}")
        with conn.cursor(name="relay_audit") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(query)
            n = len(key) + len(rest)
            for r in cur:
                pos = position(r[n], r[n + 1], r[n + 2])
                yield row(r[: len(key)]), row(r[len(key) : n]), pos, r[n + 1]
    except psycopg2.Error as exc:
        raise SinkAuditError(f"reading {target} failed: {pg_conn.scrub(str(exc).strip(), url)}") from None
    finally:
        conn.close()
