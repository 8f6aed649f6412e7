"""Offsets and topic settings of a Kafka cluster, as the brokers report them.

One small client for the questions Relay asks Kafka (earliest/latest offsets, offsets for a time,
retention settings) and the few admin actions it takes (create a topic, delete records, change a
topic setting). Clients are created lazily so constructing a ``KafkaOffsets`` never touches the network.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka import errors as kerrors
from kafka.admin import ConfigFilterType, ConfigResource, ConfigResourceType, NewTopic

from relay.errors import KafkaError, TopicNotFoundError
from relay.polling import poll


@dataclass(frozen=True)
class RecordMark:
    """One record's identity: its offset, timestamp and a CRC-32 of its key and value."""

    offset: int
    timestamp_ms: int
    crc: int

    @classmethod
    def of(cls, record: Any) -> RecordMark:
        crc = zlib.crc32(record.value or b"", zlib.crc32(record.key or b""))
        return cls(int(record.offset), int(record.timestamp), crc)


class KafkaOffsets:
    """Read offsets and topic configuration; create topics, delete records, alter topic configs."""

    def __init__(self, bootstrap: str, timeout_s: float = 10) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._consumer: KafkaConsumer | None = None
        self._admin: KafkaAdminClient | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close both clients; safe to call twice."""
        for client in (self._consumer, self._admin):
            if client is not None:
                with contextlib.suppress(Exception):  # closing must never mask the caller's error
                    client.close()
        self._consumer = None
        self._admin = None

    @property
    def _timeout_ms(self) -> int:
        return int(self.timeout_s * 1000)

    def _fail(self, what: str, topic: str | None, exc: BaseException) -> KafkaError:
        where = f" topic {topic!r}" if topic else ""
        return KafkaError(f"Kafka at {self.bootstrap}: {what}{where} failed: {type(exc).__name__}: {exc}")

    def consumer(self) -> KafkaConsumer:
        """The shared offset-reading consumer (no group, no auto commit)."""
        if self._consumer is None:
            try:
                self._consumer = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    group_id=None,
                    enable_auto_commit=False,
                    request_timeout_ms=max(self._timeout_ms, 1000) + 500,
                    bootstrap_timeout_ms=self._timeout_ms,
                    client_id="relay-offsets",
                )
            except Exception as exc:
                raise self._fail("connect", None, exc) from exc
        return self._consumer

    def admin(self) -> KafkaAdminClient:
        """The shared admin client."""
        if self._admin is None:
            try:
                self._admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap,
                    request_timeout_ms=max(self._timeout_ms, 1000),
                    bootstrap_timeout_ms=self._timeout_ms,
                    client_id="relay-admin",
                )
            except Exception as exc:
                raise self._fail("connect (admin)", None, exc) from exc
        return self._admin

    # -- reads -----------------------------------------------------------------------------------

    def topics(self) -> set[str]:
        """Names of all topics (also a cheap metadata health probe)."""
        try:
            return set(self.consumer().topics())
        except KafkaError:
            raise
        except Exception as exc:
            raise self._fail("list topics", None, exc) from exc

    def partitions(self, topic: str) -> list[int]:
        """Sorted partition ids of ``topic``; KafkaError if the topic does not exist."""
        if topic not in self.topics():
            raise TopicNotFoundError(f"Kafka at {self.bootstrap}: topic {topic!r} does not exist")
        try:
            parts = self.consumer().partitions_for_topic(topic)
        except Exception as exc:
            raise self._fail("read partitions of", topic, exc) from exc
        if not parts:
            raise KafkaError(f"Kafka at {self.bootstrap}: topic {topic!r} has no partitions")
        return sorted(parts)

    def _tps(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in self.partitions(topic)]

    def earliest(self, topic: str) -> dict[int, int]:
        """Log start offset of every partition (moves with retention and delete_records)."""
        tps = self._tps(topic)
        try:
            found = self.consumer().beginning_offsets(tps, timeout_ms=self._timeout_ms)
        except Exception as exc:
            raise self._fail("read earliest offsets of", topic, exc) from exc
        return {tp.partition: int(off) for tp, off in sorted(found.items(), key=lambda kv: kv[0].partition)}

    def latest(self, topic: str) -> dict[int, int]:
        """High watermark (next offset to be written) of every partition."""
        tps = self._tps(topic)
        try:
            found = self.consumer().end_offsets(tps, timeout_ms=self._timeout_ms)
        except Exception as exc:
            raise self._fail("read latest offsets of", topic, exc) from exc
        return {tp.partition: int(off) for tp, off in sorted(found.items(), key=lambda kv: kv[0].partition)}

    def offsets_for_time(self, topic: str, timestamp_ms: int) -> dict[int, int | None]:
        """First offset with a timestamp >= ``timestamp_ms`` per partition; None when no such record."""
        tps = self._tps(topic)
        try:
            found = self.consumer().offsets_for_times(
                {tp: int(timestamp_ms) for tp in tps}, timeout_ms=self._timeout_ms
            )
        except Exception as exc:
            raise self._fail("look up offsets for time in", topic, exc) from exc
        result: dict[int, int | None] = {}
        for tp in tps:
            hit = found.get(tp)
            result[tp.partition] = None if hit is None or hit.offset is None or hit.offset < 0 else hit.offset
        return result

    def record_timestamps(
        self, topic: str, offsets: dict[int, int], wait_s: float | None = None
    ) -> dict[int, int | None]:
        """Timestamp (epoch ms) of the first record at or after ``offsets[p]``, per partition.

        Why: the record at a consumer's cursor is the oldest one it has not applied, so its timestamp
        tells how far behind in time the consumer is, with no rate extrapolated from offset history.
        None as :meth:`records_at` says, and for a record without a timestamp (-1).
        """
        found = self.records_at(topic, offsets, wait_s)
        return {p: (r.timestamp_ms if r and r.timestamp_ms >= 0 else None) for p, r in found.items()}

    def records_at(
        self, topic: str, offsets: dict[int, int], wait_s: float | None = None
    ) -> dict[int, RecordMark | None]:
        """The first record at or after ``offsets[p]`` per partition, as a :class:`RecordMark`.

        A dedicated consumer (no group, ``auto_offset_reset='none'``) reads at most one fetch per
        partition and never moves the shared one; a partition whose offset is out of range (retention
        removed it), past the end, or not fetched within ``wait_s`` (default ``timeout_s``; only
        control records left, e.g. a transaction marker) maps to None.
        """
        result: dict[int, RecordMark | None] = {int(p): None for p in offsets}
        wanted = {TopicPartition(topic, int(p)): int(off) for p, off in offsets.items() if off >= 0}
        if not wanted:
            return result
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="none",
                request_timeout_ms=max(self._timeout_ms, 1000) + 500,
                bootstrap_timeout_ms=self._timeout_ms,
                client_id="relay-records-at",
            )
        except Exception as exc:
            raise self._fail("connect (records at offsets)", topic, exc) from exc
        try:
            consumer.assign(list(wanted))
            for tp, off in wanted.items():
                consumer.seek(tp, off)
            deadline = time.monotonic() + (self.timeout_s if wait_s is None else wait_s)
            pending = set(wanted)
            while pending and time.monotonic() < deadline:
                try:
                    fetched = consumer.poll(timeout_ms=200, max_records=500)
                except kerrors.OffsetOutOfRangeError as exc:  # retention removed it: no record
                    named = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
                    for tp in (set(named) & pending) or set(pending):
                        pending.discard(tp)
                        consumer.pause(tp)
                    continue
                for tp, records in fetched.items():
                    if tp in pending and records:
                        result[tp.partition] = RecordMark.of(records[0])
                        pending.discard(tp)
                        consumer.pause(tp)
        except Exception as exc:
            raise self._fail("read the records at offsets of", topic, exc) from exc
        finally:
            with contextlib.suppress(Exception):  # closing must never mask the caller's error
                consumer.close()
        return result

    def topic_config(self, topic: str) -> dict[str, str]:
        """Every config entry the broker reports for ``topic`` (e.g. ``retention.ms``)."""
        resource = ConfigResource(ConfigResourceType.TOPIC, topic)
        self.partitions(topic)  # a missing topic must fail loudly, not describe as {}
        try:
            responses = self.admin().describe_configs([resource], config_filter=ConfigFilterType.ALL)
        except Exception as exc:
            raise self._fail("describe configs of", topic, exc) from exc
        return _config_values(responses, topic)

    # -- writes ----------------------------------------------------------------------------------

    def ensure_topic(self, topic: str, partitions: int, configs: dict[str, str] | None = None) -> bool:
        """Create ``topic`` if missing; True when this call created it. Idempotent."""
        if topic in self.topics():
            return False
        new = NewTopic(
            name=topic,
            num_partitions=partitions,
            replication_factor=1,
            topic_configs={k: str(v) for k, v in (configs or {}).items()},
        )
        try:
            self.admin().create_topics([new], timeout_ms=self._timeout_ms)
        except kerrors.TopicAlreadyExistsError:
            return False
        except Exception as exc:
            raise self._fail("create", topic, exc) from exc
        self._wait_for_topic(topic)
        return True

    def _wait_for_topic(self, topic: str) -> None:
        """Poll metadata until the new topic is visible to the consumer (creation is asynchronous)."""
        consumer = self.consumer()

        def visible() -> bool | None:
            consumer._client.cluster.request_update()  # force a refresh, topics() may be cached
            return True if consumer.partitions_for_topic(topic) else None

        poll(
            visible,
            self.timeout_s,
            0.1,
            transient=(Exception,),  # kafka-python raises many types while metadata settles
            on_timeout=lambda: KafkaError(
                f"Kafka at {self.bootstrap}: topic {topic!r} not visible {self.timeout_s}s after creation"
            ),
        )

    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        """Delete every record below ``before[partition]`` (advances the log start offset)."""
        records = {TopicPartition(topic, int(p)): int(off) for p, off in before.items()}
        if not records:
            return
        try:
            self.admin().delete_records(records, timeout_ms=self._timeout_ms)
        except Exception as exc:
            raise self._fail(f"delete records {before} of", topic, exc) from exc

    def set_topic_config(self, topic: str, configs: dict[str, str]) -> None:
        """Change topic settings (e.g. ``retention.ms``); only the given keys are touched."""
        resource = ConfigResource(
            ConfigResourceType.TOPIC, topic, configs={k: str(v) for k, v in configs.items()}
        )
        try:
            responses = self.admin().alter_configs([resource])
        except Exception as exc:
            raise self._fail(f"alter configs {configs} of", topic, exc) from exc
        result = (responses or {}).get("topic", {}).get(topic, "missing from the response")
        if result != "OK":
            raise KafkaError(
                f"Kafka at {self.bootstrap}: alter configs {configs} of topic {topic!r}: {result}"
            )


def _config_values(responses: Any, topic: str) -> dict[str, str]:
    """Flatten kafka-python 3.x ``{"topic": {name: {key: {"value": ...}}}}`` into ``{key: value}``."""
    entries = (responses or {}).get("topic", {}).get(topic, {})
    return {str(k): str(v.get("value")) for k, v in entries.items() if v.get("value") is not None}
