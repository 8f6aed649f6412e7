"""Kafka clients for the transactional sink: checked settings, pooled producers and readers, and
errors that name the topic but never a credential.

Spark reuses its Python workers across tasks, so a transactional producer initialised by one task
serves the next task of the same ``transactional.id`` in that process (``init_transactions`` costs a
coordinator round trip and fences every other holder of the id: doing it once per process, not once
per task, is what keeps the sink cheap). Pools are keyed by ``(pid, settings, id)``: workers are
forked from a daemon, and a client inherited through ``fork`` must never be used by the child.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import errors as kerrors

from relay.errors import ConfigError
from relay.sinks.base import SinkError, SinkUnavailableError

MAX_POOLED_PRODUCERS = 64
CLOSE_TIMEOUT_S = 5
# Settings the sink owns: exactly-once depends on them (or they would break the byte contract).
RESERVED = frozenset(
    {
        "bootstrap_servers",
        "transactional_id",
        "enable_idempotence",
        "acks",
        "retries",
        "key_serializer",
        "value_serializer",
        "partitioner",
        "kafka_client",
        "selector",
        "metric_reporters",
    }
)
_SECRET_HINTS = ("password", "secret", "token", "oauth", "ssl_context")
_HOST_PORT = re.compile(r"^\[?[A-Za-z0-9._:-]+\]?:\d{1,5}$")
# Throughput defaults (a task sends thousands of records): the user's client_config wins. Every
# send of the sinks is followed by flush() or commit_transaction(), which send at once whatever
# lingers: a long linger only stops the sender thread from shipping small batches during the send
# loop (3,000 records in three transactions: 125 -> 92 ms against 5 ms, measured).
_PRODUCER_DEFAULTS = {"linger_ms": 1000, "batch_size": 256 * 1024, "max_block_ms": 60_000}


def _is_secret(name: str) -> bool:
    return any(h in name for h in _SECRET_HINTS)


@dataclass(frozen=True)
class ClientSettings:
    """Bootstrap servers plus extra kafka-python settings (security, timeouts), checked once."""

    bootstrap: tuple[str, ...]
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def parse(
        cls, bootstrap: str | list[str] | tuple[str, ...], config: Mapping[str, Any] | None
    ) -> ClientSettings:
        """Refuse a malformed bootstrap list or an unknown / reserved setting with a ConfigError."""
        servers = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap or ())
        servers = [s.strip() for s in servers if isinstance(s, str) and s.strip()]
        bad = [s for s in servers if not _HOST_PORT.match(s) or "@" in s]
        if not servers or bad:
            raise ConfigError(
                f"bootstrap must be 'host:port[,host:port...]', got {len(bad) or 'no'} malformed "
                f"server(s){': ' + ', '.join(repr(b) for b in bad if '@' not in b) if bad else ''}"
            )
        extra = dict(config or {})
        if not all(isinstance(k, str) for k in extra):
            raise ConfigError("client_config keys must be kafka-python setting names (strings)")
        known = set(KafkaProducer.DEFAULT_CONFIG)
        reserved = sorted(k for k in extra if k in RESERVED)
        if reserved:
            raise ConfigError(
                f"client_config may not set {reserved}: the sink sets them (exactly-once needs them)"
            )
        unknown = sorted(k for k in extra if k not in known)
        if unknown:
            raise ConfigError(f"client_config has unknown kafka-python producer setting(s) {unknown}")
        return cls(tuple(servers), tuple(sorted(extra.items(), key=lambda kv: kv[0])))

    @property
    def servers(self) -> str:
        return ",".join(self.bootstrap)

    def shown(self) -> dict[str, Any]:
        """The extra settings with secret values masked (for repr and messages)."""
        return {k: ("***" if _is_secret(k) else v) for k, v in self.extra}

    def secrets(self) -> list[str]:
        found = {str(v) for k, v in self.extra if _is_secret(k) and isinstance(v, (str, bytes)) and v}
        return sorted(found, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text

    def producer_config(self, transactional_id: str) -> dict[str, Any]:
        extra = dict(self.extra)
        return {
            **_PRODUCER_DEFAULTS,
            **extra,
            "bootstrap_servers": list(self.bootstrap),
            "transactional_id": transactional_id,
            "enable_idempotence": True,
            "acks": "all",
        }

    def consumer_config(self, isolation: str) -> dict[str, Any]:
        shared = set(KafkaConsumer.DEFAULT_CONFIG)
        extra = {k: v for k, v in self.extra if k in shared}
        return {
            **extra,
            "bootstrap_servers": list(self.bootstrap),
            "isolation_level": isolation,
            "enable_auto_commit": False,
            "group_id": None,
            "auto_offset_reset": "none",
        }

    def key(self) -> tuple[str, str]:
        """A hashable identity of the settings for the pools (values may be unhashable objects)."""
        return self.servers, repr(self.extra)


_UNAVAILABLE = (
    kerrors.KafkaConnectionError,
    kerrors.KafkaTimeoutError,
    kerrors.RequestTimedOutError,
    kerrors.NodeNotReadyError,
    kerrors.BrokerNotAvailableError,
    kerrors.CoordinatorNotAvailableError,
    TimeoutError,
    OSError,
)


def wrap(exc: BaseException, settings: ClientSettings, where: str) -> SinkError:
    """A vendor error as the sink's: unreachable or timed out -> SinkUnavailableError (retry later)."""
    text = settings.scrub(f"{type(exc).__name__}: {exc}".strip())
    cls = SinkUnavailableError if isinstance(exc, _UNAVAILABLE) else SinkError
    return cls(f"{where} (Kafka at {settings.servers}): {text}")


@contextmanager
def kafka_errors(settings: ClientSettings, where: str) -> Iterator[None]:
    """Wrap kafka-python's errors raised inside the block (the sink's own errors pass through)."""
    try:
        yield
    except SinkError:
        raise
    except (kerrors.KafkaError, TimeoutError, OSError) as exc:
        wrapped = wrap(exc, settings, where)
        if settings.scrub(str(exc)) != str(exc):
            raise wrapped from None  # the original text held a secret: don't chain it
        raise wrapped from exc


# ---- pooled transactional producers ----------------------------------------------------------


@dataclass
class PooledProducer:
    """An initialised transactional producer and what it knows of its id's marker.

    ``marker`` is exact as long as the producer was not fenced: any other producer of the id must
    call ``init_transactions`` before it can commit, and that makes this producer's next commit
    fail. So a commit that succeeds proves the cached marker was current (see kafka_transactional).
    """

    producer: KafkaProducer
    marker: Any = None
    instance: Any = None


_lock = threading.Lock()
_producers: OrderedDict[tuple[int, tuple[str, str], str], PooledProducer] = OrderedDict()
_readers: dict[tuple[int, tuple[str, str]], list[tuple[KafkaConsumer, KafkaConsumer]]] = {}


def new_producer(settings: ClientSettings, transactional_id: str) -> KafkaProducer:
    """A producer for ``transactional_id`` after ``init_transactions``: every older producer of the
    id is fenced, and its open transaction aborted, when this returns."""
    producer = KafkaProducer(**settings.producer_config(transactional_id))
    try:
        producer.init_transactions()
    except BaseException:
        close_quietly(producer)
        raise
    return producer


def key_partitioner(producer: Any, topic: str) -> Callable[[bytes | None], int | None]:
    """The partition kafka-python's default partitioner picks for a key (murmur2 over the topic's
    sorted partitions, as Java's client), each distinct key hashed once: in a send loop the pure-
    Python hash was ~30% of ``send()`` (60 -> 43 us a record measured, 3,000 records).

    None (send() decides, as without this) for a key of None, and for every key when the producer
    has a partitioner or key serializer of the user's (``client_config``)."""
    from kafka.partitioner.default import DefaultPartitioner, murmur2

    config = producer.config
    if type(config.get("partitioner")) is not DefaultPartitioner or config.get("key_serializer") is not None:
        return lambda _key: None
    parts = sorted(producer.partitions_for(topic))
    chosen: dict[bytes, int] = {}

    def partition(key: bytes | None) -> int | None:
        if key is None:
            return None
        found = chosen.get(key)
        if found is None:
            found = chosen[key] = parts[(murmur2(key) & 0x7FFFFFFF) % len(parts)]
        return found

    return partition


def checkout_producer(settings: ClientSettings, transactional_id: str) -> PooledProducer | None:
    """This process's idle producer for the id, taken out of the pool (one user at a time)."""
    with _lock:
        return _producers.pop((os.getpid(), settings.key(), transactional_id), None)


def checkin_producer(settings: ClientSettings, transactional_id: str, entry: PooledProducer) -> None:
    """Give a healthy producer back; the least recently used one is closed when the pool is full."""
    evicted: list[PooledProducer] = []
    with _lock:
        _producers[(os.getpid(), settings.key(), transactional_id)] = entry
        while len(_producers) > MAX_POOLED_PRODUCERS:
            evicted.append(_producers.popitem(last=False)[1])
    for old in evicted:
        close_quietly(old.producer)


def discard_producer(settings: ClientSettings, transactional_id: str) -> None:
    """Close this process's pooled producer of the id, if any (a fence took the id over)."""
    entry = checkout_producer(settings, transactional_id)
    if entry is not None:
        close_quietly(entry.producer)


def close_quietly(client: Any) -> None:
    """Close without committing anything; closing must never mask the caller's error."""
    with suppress(Exception):
        if isinstance(client, KafkaProducer):
            client.close(timeout=CLOSE_TIMEOUT_S)
        else:
            client.close()


# ---- pooled marker readers ---------------------------------------------------------------------


@contextmanager
def readers(settings: ClientSettings) -> Iterator[tuple[KafkaConsumer, KafkaConsumer]]:
    """(read_committed consumer for records, read_uncommitted one for the high watermark)."""
    key = (os.getpid(), settings.key())
    with _lock:
        idle = _readers.get(key, [])
        pair = idle.pop() if idle else None
    if pair is None:
        committed = KafkaConsumer(**settings.consumer_config("read_committed"))
        try:
            pair = (committed, KafkaConsumer(**settings.consumer_config("read_uncommitted")))
        except BaseException:
            close_quietly(committed)
            raise
    healthy = False
    try:
        yield pair
        healthy = True
    finally:
        if healthy:
            with _lock:
                _readers.setdefault(key, []).append(pair)
        else:
            for consumer in pair:
                close_quietly(consumer)


@contextmanager
def admin(settings: ClientSettings) -> Iterator[KafkaAdminClient]:
    """A short-lived admin client (driver side only: topics are checked once per start)."""
    shared = set(KafkaAdminClient.DEFAULT_CONFIG)
    config = {k: v for k, v in settings.extra if k in shared}
    client = KafkaAdminClient(bootstrap_servers=list(settings.bootstrap), **config)
    try:
        yield client
    finally:
        close_quietly(client)


def close_all() -> None:
    """Close this process's pooled clients (tests, and a worker that is shutting down)."""
    pid = os.getpid()
    with _lock:
        producers = [_producers.pop(k) for k in list(_producers) if k[0] == pid]
        pairs = [p for k in list(_readers) if k[0] == pid for p in _readers.pop(k)]
    for entry in producers:
        close_quietly(entry.producer)
    for pair in pairs:
        for consumer in pair:
            close_quietly(consumer)
