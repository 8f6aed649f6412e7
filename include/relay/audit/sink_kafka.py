"""The Kafka sink's output judged input offset by input offset (pure: no broker, no Spark here).

Every record ``KafkaTransactionalSink`` writes names its input record (header ``relay.source`` =
``<topic>:<partition>:<offset>``) and its writer (``relay.writer`` = ``<instance>:<epoch>:<batch>``).
The output is grouped by input offset; each applied input offset (the ledger's runs, ``applied``) is
then judged against the transform's output for it (``Expected``, re-evaluated from the version's
code): output from two different writers is a duplicate, no output where the transform has some is
missing, a different multiset of (key, value) is wrong (a count mismatch too). The content is
compared with the writer's version's output where that version was evaluated for the offset (an
aborted green may have written records blue applies in the ledger), else the applier's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from relay.audit.applied import Applied
from relay.audit.sink_report import SinkAudit
from relay.sinks.kafka_transactional import SOURCE_HEADER, WRITER_HEADER

Source = tuple[int, int]  # (partition, offset) of the pipeline's input topic


def digest(key: bytes | None, value: bytes | None) -> bytes:
    """Identity of one output record's content (None and b"" differ)."""
    h = hashlib.blake2b(digest_size=12)
    for part in (key, value):
        h.update(b"\xff" if part is None else len(part).to_bytes(4, "big") + part)
    return h.digest()


def as_bytes(value: object) -> bytes | None:
    """A transform's key or value as the sink sends it (str as UTF-8); TypeError otherwise."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"the Kafka sink takes bytes, str or None, the transform gave a {type(value).__name__}")


def parse_source(raw: bytes | None, topic: str) -> Source | None:
    """(partition, offset) of a ``relay.source`` header naming ``topic``; None for anything else."""
    try:
        name, partition, offset = (raw or b"").decode().rsplit(":", 2)
        found = (int(partition), int(offset))
    except ValueError:
        return None
    return found if name == topic and found[0] >= 0 and found[1] >= 0 else None


def writer_instance(writer: str) -> int | None:
    try:
        return int(writer.split(":", 1)[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class OutputRecord:
    partition: int  # where it is in the output topic
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass
class OutputIndex:
    """The output topic's records grouped by the input offset they name, then by writer."""

    topic: str  # the pipeline's INPUT topic (what ``relay.source`` must name)
    by_source: dict[Source, dict[str, list[tuple[bytes, str]]]] = field(default_factory=dict)
    records: int = 0

    def add(self, record: OutputRecord, audit: SinkAudit, output_topic: str) -> None:
        self.records += 1
        headers = dict(record.headers or ())
        where = f"{output_topic}[{record.partition}]@{record.offset}"
        source = parse_source(headers.get(SOURCE_HEADER), self.topic)
        writer = headers.get(WRITER_HEADER)
        if source is None or writer is None:
            audit.add("foreign", where)  # no (or another topic's) source position: not Relay's record
            return
        writers = self.by_source.setdefault(source, {})
        writers.setdefault(writer.decode(errors="replace"), []).append(
            (digest(record.key, record.value), where)
        )

    def writer_instances(self) -> dict[int, list[Source]]:
        """Per writer instance, the input offsets it wrote output for."""
        out: dict[int, list[Source]] = {}
        for source, writers in self.by_source.items():
            for writer in writers:
                instance = writer_instance(writer)
                if instance is not None:
                    out.setdefault(instance, []).append(source)
        return out


@dataclass
class Expected:
    """Per version, the input records its transform was evaluated over and their non-empty output."""

    evaluated: dict[str, set[Source]] = field(default_factory=dict)
    outputs: dict[tuple[str, int, int], list[bytes]] = field(default_factory=dict)

    def add_input(self, version: str, partition: int, offset: int) -> None:
        self.evaluated.setdefault(version, set()).add((partition, offset))

    def add_output(self, version: str, partition: int, offset: int, key: object, value: object) -> None:
        self.outputs.setdefault((version, partition, offset), []).append(
            digest(as_bytes(key), as_bytes(value))
        )

    def of(self, version: str | None, partition: int, offset: int) -> list[bytes] | None:
        """The sorted output digests of the record (None: not evaluated by that version)."""
        if version is None or (partition, offset) not in self.evaluated.get(version, ()):
            return None
        return sorted(self.outputs.get((version, partition, offset), []))


def compare(
    applied: Applied,
    expected: Expected,
    output: OutputIndex,
    earliest: dict[int, int],
    audit: SinkAudit,
) -> None:
    """Judge every evaluated input offset, then the output naming offsets nobody evaluated."""
    name = applied.topic
    for version, sources in expected.evaluated.items():
        for partition, offset in sorted(sources):
            run = applied.run_at(partition, offset)
            if run is None or run.version != version:
                continue  # evaluated only for a writer's content; judged with its applier's version
            got = output.by_source.pop((partition, offset), None)
            _judge(applied, expected, version, partition, offset, got, audit)
    for (partition, offset), got in sorted(output.by_source.items()):
        at = f"{name}:{partition}:{offset}"
        if len(got) > 1:
            audit.add("duplicated", _dup(at, got))
            continue
        run = applied.run_at(partition, offset)
        if run is None:
            audit.add("ahead", at)
        elif offset < earliest.get(partition, 0) or run.version not in expected.evaluated:
            audit.add("unverified", at)
        else:  # the ledger applied it, Kafka holds no input record there (a transaction marker)
            audit.add("wrong", {"source": at, "output": _where(got), "why": "no input record"})
    output.by_source.clear()


def _judge(
    applied: Applied,
    expected: Expected,
    version: str,
    partition: int,
    offset: int,
    got: dict[str, list[tuple[bytes, str]]] | None,
    audit: SinkAudit,
) -> None:
    at = f"{applied.topic}:{partition}:{offset}"
    want = expected.of(version, partition, offset) or []
    if not got:
        audit.add("missing", at) if want else audit.add("ok")
        return
    if len(got) > 1:
        audit.add("duplicated", _dup(at, got))
        return
    ((writer, items),) = got.items()
    instance = writer_instance(writer)
    by_writer = expected.of(
        applied.writer_version(instance) if instance is not None else None, partition, offset
    )
    if sorted(d for d, _ in items) == (want if by_writer is None else by_writer):
        audit.add("ok")
    else:
        why = f"{len(items)} record(s), {len(want)} expected" if len(items) != len(want) else "content"
        audit.add("wrong", {"source": at, "output": _where(got), "why": why})


def _where(got: dict[str, list[tuple[bytes, str]]]) -> list[str]:
    return [w for items in got.values() for _, w in items][:4]


def _dup(at: str, got: dict[str, list[tuple[bytes, str]]]) -> dict[str, object]:
    return {"source": at, "writers": sorted(got), "output": _where(got)}


def sources_in(sources: Iterable[Source]) -> dict[int, list[tuple[int, int]]]:
    """Single-offset ranges per partition (the offsets a writer wrote), for the input reader."""
    out: dict[int, list[tuple[int, int]]] = {}
    for partition, offset in sources:
        out.setdefault(partition, []).append((offset, offset + 1))
    return out
