"""``relay audit --deep`` on an executor-side sink: what the sink holds, judged against Kafka's input.

The ledger says which offsets were applied; only the sink says what became of them. So:

1. The ledger first (``applied``): who applied which offsets. Tasks write before the ledger commit,
   so the effect of every batch committed by then is already in the sink when it is read next.
2. The sink, built in this process from the newest version's artifact with the pipeline's
   ``secret_env`` from the environment (as the driver builds it), read independently (``sink_reads``).
3. The applied offsets' input records, read from Kafka (read_committed, no silent offset reset).
4. Each version's transform re-evaluated from its artifact over the records it applied, in a local
   Spark session (``versions``, ``evaluate``).
5. The comparison: ``sink_kafka`` (per input offset), ``sink_tables`` (per key, per group).

A ForEachBatch function's target, or a sink Relay doesn't know, cannot be read: the report says the
audit is the ledger's only. The counter's ``LedgerMessagesSink`` rows are in the ledger and counted
there (``relay.audit``'s table), offset by offset against Kafka's records.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from relay.audit import sink_kafka, sink_tables
from relay.audit.applied import Applied, Ranges, clip, contains, union
from relay.audit.evaluate import InputRecords, LocalSpark
from relay.audit.kafka_records import CommittedRecords
from relay.audit.sink_reads import output_records, table_rows
from relay.audit.sink_report import SinkAudit, SinkAuditError
from relay.audit.versions import VersionCode, find, forget, load
from relay.config import RelayConfig
from relay.kafka.offsets import KafkaOffsets
from relay.ledger.store import Ledger
from relay.pipeline import ForEachBatch, Pipeline, secret_values
from relay.sinks.base import SOURCE_COLUMNS

Progress = Callable[[str], None]
CUTS = {  # a stateful evaluation without some records, to tell which groups they fed
    "until_us": " (without the last warm_up_s: which windows are open)",
    "since_us": " (without the first warm_up_s after retention: which windows straddle it)",
}


@dataclass
class _Run:
    """What one sink audit has read so far, and the clients it holds."""

    config: RelayConfig
    ledger: Ledger
    applied: Applied
    progress: Progress
    audit: SinkAudit = field(default_factory=lambda: SinkAudit("unknown", ""))
    earliest: dict[int, int] = field(default_factory=dict)
    latest: dict[int, int] = field(default_factory=dict)
    codes: dict[str, VersionCode | None] = field(default_factory=dict)
    spark: LocalSpark | None = None
    reader: CommittedRecords | None = None

    def timed(self, name: str, t0: float) -> None:
        self.audit.timings[name] = round(self.audit.timings.get(name, 0.0) + time.perf_counter() - t0, 2)

    def code(self, version: str) -> VersionCode | None:
        if version not in self.codes:
            scratch = self.config.data_dir / "audit" / self.config.pipeline
            self.codes[version] = find(self.config, self.ledger, version, scratch)
        return self.codes[version]

    def read_input(self, ranges: Ranges, what: str) -> InputRecords:
        t0, records = time.perf_counter(), InputRecords(self.config.topic)
        size = sum(b - a for rs in ranges.values() for a, b in rs)
        self.progress(f"sink audit: reading {size:,} input offsets of {self.config.topic} ({what})")
        if self.reader is None:
            self.reader = CommittedRecords(
                self.config.kafka_bootstrap, self.config.topic, 30.0, self.progress
            )
        for partition, rs in sorted(ranges.items()):
            for a, b in rs:
                for record in self.reader.records(partition, a, b):
                    records.add(partition, record)
        self.timed("read input", t0)
        return records

    def evaluate(
        self, version: str, records: InputRecords, columns: list[str] | None, **cut: int
    ) -> tuple[list[str], Iterator[tuple]]:
        """Version ``version``'s transform over ``records`` (its code loaded from its artifact)."""
        code = self.code(version)
        assert code is not None and code.package is not None
        pipeline = load(code)
        if self.spark is None:
            self.spark = LocalSpark(self.config.data_dir / "audit" / "spark", self.progress)
        table = records.table(cut.get("since_us"), cut.get("until_us"))
        self.progress(
            f"sink audit: re-evaluating version {version}'s transform over {table.num_rows:,} records"
        )
        t0 = time.perf_counter()
        names, rows = self.spark.run(pipeline, code.package, table, columns)
        out = list(rows)
        self.timed("evaluate (local Spark)", t0)
        which = "".join(CUTS[c] for c in cut)
        self.audit.how.append(
            f"transform of version {version} (artifact from {code.source}) re-evaluated in a local Spark "
            f"session over {table.num_rows:,} input records{which}: {len(out):,} rows"
        )
        return names, iter(out)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.spark is not None:
            self.spark.close()
        for code in self.codes.values():
            if code is not None and code.package:
                forget(code.package)


def audit_sink(config: RelayConfig, ledger: Ledger, progress: Progress) -> SinkAudit:
    """Read the pipeline's sink and judge it against Kafka's input (see the module docstring)."""
    started = time.perf_counter()
    applied = Applied.from_ledger(ledger, config.pipeline, config.topic)
    run = _Run(config, ledger, applied, progress)
    run.timed("read ledger", started)
    try:
        audit = _audit(run)
    finally:
        run.close()
    audit.timings["total"] = round(time.perf_counter() - started, 2)
    return audit


def _audit(run: _Run) -> SinkAudit:
    applied, config = run.applied, run.config
    version = applied.newest_version
    if version is None:
        return _ledger_only("unknown", "no instance yet", "the pipeline never ran: nothing to read")
    code = run.code(version)
    if code is None and _rows_in_ledger(run):
        return _counter(run)
    if code is None:
        return _ledger_only("unknown", f"version {version}", f"version {version}'s artifact is gone")
    if code.package is None:
        return _counter(run)
    pipeline = load(code)
    sink = build_sink(pipeline, config)
    run.audit = _describe(sink, pipeline)
    if not run.audit.read:
        return run.audit
    if run.audit.kind == "counter":
        return _counter(run)
    leases = sum(len(r) for r in applied.runs.values())
    run.audit.how.append(
        f"ledger: {applied.size():,} applied offsets of {config.topic} in {leases} lease(s), "
        f"version(s) {', '.join(applied.applied_versions())}"
    )
    with KafkaOffsets(config.kafka_bootstrap) as kafka:
        run.earliest, run.latest = kafka.earliest(config.topic), kafka.latest(config.topic)
    _unverified_below_earliest(run)
    {"kafka": _kafka, "upsert": _upsert, "stateful": _stateful}[run.audit.kind](run, sink, pipeline)
    return run.audit


def build_sink(pipeline: Pipeline, config: RelayConfig) -> Any:
    """The sink as the driver builds it: the factory called with ``secret_env`` from the environment
    and the ledger's URL where every driver has it (the counter's sink writes to the ledger)."""
    from relay.spark.launcher import LEDGER_URL_ENV

    secret_values(pipeline, os.environ)  # names a missing variable, never a value
    had = os.environ.get(LEDGER_URL_ENV)
    os.environ[LEDGER_URL_ENV] = had or config.ledger_url
    try:
        return pipeline.build_sink()
    finally:
        if had is None:
            os.environ.pop(LEDGER_URL_ENV, None)


def _describe(sink: Any, pipeline: Pipeline) -> SinkAudit:
    from relay.sinks.kafka_transactional import KafkaTransactionalSink
    from relay.sinks.ledger_messages import LedgerMessagesSink
    from relay.sinks.pg_schema import shown
    from relay.sinks.postgres_upsert import PostgresUpsertSink

    if isinstance(sink, KafkaTransactionalSink):
        return SinkAudit("kafka", f"topic {sink.topic} at {sink.settings.servers}")
    if isinstance(sink, PostgresUpsertSink):
        kind = "stateful" if pipeline.stateful else "upsert"
        return SinkAudit(kind, f"table {shown(sink.schema, sink.table)} at {sink.url}")
    if isinstance(sink, LedgerMessagesSink):
        return SinkAudit("counter", "the ledger's messages table")
    if isinstance(sink, ForEachBatch):
        return _ledger_only(
            "foreach_batch", "a ForEachBatch function", "Relay cannot read what a ForEachBatch function wrote"
        )
    return _ledger_only("unknown", type(sink).__name__, f"Relay cannot read a {type(sink).__name__}")


def _ledger_only(kind: str, target: str, why: str) -> SinkAudit:
    return SinkAudit(kind, target, read=False, notes=[f"{why}: this audit is the ledger's only"])


def _counter(run: _Run) -> SinkAudit:
    audit = SinkAudit("counter", "the ledger's messages table")
    audit.how.append(
        "one messages row per applied offset, counted in the ledger with SQL and walked offset by offset "
        "beside Kafka's read_committed records (the table above)"
    )
    return audit


def _rows_in_ledger(run: _Run) -> bool:
    """The counter's (or the reference job's) rows are in the ledger: its own table counts them."""
    from relay.audit import ledger_counts as lc
    from relay.ledger.snapshot import read_snapshot

    with read_snapshot(run.ledger) as conn:
        return (
            lc.has_message_ranges(conn, run.config.pipeline)
            or lc.sink_totals(conn, run.config.pipeline)[1] > 0
        )


def _unverified_below_earliest(run: _Run) -> None:
    for partition, rs in sorted(run.applied.ranges().items()):
        low = run.earliest.get(partition, 0)
        gone = sum(max(0, min(b, low) - a) for a, b in rs)
        if gone:
            run.audit.add("unverified", f"{run.config.topic}[{partition}] below {low}: input deleted", n=gone)


def _evaluable(run: _Run, version: str) -> bool:
    code = run.code(version)
    if code is None or code.package is None:
        n = sum(b - a for rs in run.applied.ranges(version).values() for a, b in rs)
        run.audit.add("unverified", f"version {version}: its artifact is gone", n=n)
        return False
    return True


def _kafka(run: _Run, sink: Any, pipeline: Pipeline) -> None:
    audit, applied, topic = run.audit, run.applied, run.config.topic
    t0, output, starts = time.perf_counter(), sink_kafka.OutputIndex(topic), {}
    for record in output_records(sink, run.progress, starts):
        output.add(record, audit, sink.topic)
    run.timed("read sink", t0)
    cut = {p: o for p, o in starts.items() if o > 0}
    if cut:
        audit.notes.append(
            f"output partitions {cut} start past offset 0 (retention, compaction or delete_records "
            "removed records): an effect counted missing may be a record the output's retention removed"
        )
    audit.how.append(
        f"output topic {sink.topic}: {output.records:,} committed records read (read_committed, from each "
        f"partition's earliest offset to its end), {audit.counts['foreign']} without Relay's headers"
    )
    wanted: dict[str, Ranges] = {v: applied.ranges(v) for v in applied.applied_versions()}
    for instance, sources in output.writer_instances().items():  # a writer of another version
        version = applied.writer_version(instance)
        if version is not None:
            other = [s for s in sources if (r := applied.run_at(*s)) is not None and r.version != version]
            wanted[version] = union(wanted.get(version, {}), sink_kafka.sources_in(other))
    expected = sink_kafka.Expected()
    columns = [
        "topic",
        "partition",
        "offset",
        sink.value_column,
        *([sink.key_column] if sink.key_column else []),
    ]
    for version, ranges in sorted(wanted.items()):
        if not _evaluable(run, version):
            continue
        records = run.read_input(clip(ranges, run.earliest, run.latest), f"version {version}")
        for partition, offset in records.sources():
            expected.add_input(version, partition, offset)
        _, rows = run.evaluate(version, records, columns)
        held = expected.evaluated.get(version, set())
        try:
            for r in rows:
                if r[0] == topic and (r[1], r[2]) in held:
                    expected.add_output(version, r[1], r[2], r[4] if len(r) > 4 else None, r[3])
        except TypeError as exc:
            raise SinkAuditError(f"version {version}'s transform: {exc}") from None
    t0 = time.perf_counter()
    sink_kafka.compare(applied, expected, output, run.earliest, audit)
    run.timed("compare", t0)


def _upsert(run: _Run, sink: Any, pipeline: Pipeline) -> None:
    audit, applied, topic = run.audit, run.applied, run.config.topic
    newest, columns, evaluated = sink_tables.NewestRows(), list(sink.columns or []) or None, set()
    for version in applied.applied_versions():
        if not _evaluable(run, version):
            continue
        evaluated.add(version)
        ranges = clip(applied.ranges(version), run.earliest, run.latest)
        records = run.read_input(ranges, f"version {version}")
        asked = None if columns is None else [*SOURCE_COLUMNS, *columns]
        names, rows = run.evaluate(version, records, asked)
        columns = columns or [c for c in names if c not in SOURCE_COLUMNS]
        at = {c: names.index(c) for c in [*SOURCE_COLUMNS, *columns]}
        keys = [at[k] for k in sink.key]
        rest = [at[c] for c in columns if c not in sink.key]
        for r in rows:
            t, p, o = r[at["topic"]], r[at["partition"]], r[at["offset"]]
            key = sink_tables.row(r[i] for i in keys)
            if t == topic and contains(ranges.get(p, []), o) and None not in key:
                newest.add(key, sink_tables.position(t, p, o), sink_tables.row(r[i] for i in rest))

    def state(partition: int, offset: int) -> str:
        found = applied.run_at(partition, offset)
        if found is None:
            return "ahead"
        if offset < run.earliest.get(partition, 0) or found.version not in evaluated:
            return "unverified"
        return "applied"

    t0, stored = time.perf_counter(), list(table_rows(sink, columns or [], run.progress))
    run.timed("read sink", t0)
    audit.how.append(f"table: {len(stored):,} rows read (key, values and source position)")
    sink_tables.compare_upsert(topic, newest, ((k, v, pos) for k, v, pos, _ in stored), state, audit)


def _stateful(run: _Run, sink: Any, pipeline: Pipeline) -> None:
    audit, applied = run.audit, run.applied
    newest = applied.newest_version or ""
    if not _evaluable(run, newest):
        return
    records = run.read_input(clip(applied.ranges(), run.earliest, run.latest), "every applied record")
    declared, names = list(sink.columns or []) or None, []

    def groups(version: str, **cut: int) -> dict[sink_tables.Key, sink_tables.Values]:
        found, rows = run.evaluate(version, records, declared, **cut)
        names[:] = [c for c in found if c not in SOURCE_COLUMNS]
        keys = [found.index(k) for k in sink.key]
        rest = [found.index(c) for c in names if c not in sink.key]
        return {sink_tables.row(r[i] for i in keys): sink_tables.row(r[i] for i in rest) for r in rows}

    expected = {newest: groups(newest)}
    t0 = time.perf_counter()
    stored = [(k, v, gen) for k, v, _, gen in table_rows(sink, declared or names, run.progress)]
    run.timed("read sink", t0)
    audit.how.append(f"table: {len(stored):,} groups read (written by generations {_gens(stored)})")
    for version in {applied.generation_version(g) for _, _, g in stored if g is not None} - {None, newest}:
        if version is not None and _evaluable(run, version):
            expected[version] = groups(version)
    scratch = SinkAudit("stateful", "")
    differ = sink_tables.compare_groups(stored, expected, applied.generation_version, newest, scratch)
    open_keys: set[sink_tables.Key] = set()
    edge_keys: set[sink_tables.Key] = set()
    if differ and len(records):
        # Which differing groups got records in the last warm_up_s (still open while the pipeline
        # runs), or in the first warm_up_s after input retention deleted (windows that straddle it).
        oldest, latest = records.timestamps_us()
        window = int(float(pipeline.warm_up_s or 0) * 1_000_000)
        for version, full in expected.items():
            tail = groups(version, until_us=latest - window)
            open_keys |= {k for k in differ if tail.get(k) != full.get(k)}
            if audit.counts["unverified"]:
                head = groups(version, since_us=oldest + window)
                edge_keys |= {k for k in differ if head.get(k) != full.get(k)}
    sink_tables.compare_groups(
        stored,
        expected,
        applied.generation_version,
        newest,
        audit,
        open_keys=frozenset(open_keys),
        edge_keys=frozenset(edge_keys),
    )


def _gens(stored: list[tuple[Any, Any, int | None]]) -> str:
    return ", ".join(str(g) for g in sorted({g for _, _, g in stored if g is not None})) or "none"
