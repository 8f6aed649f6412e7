"""Section ``ledger``: one counter batch's ledger work on SQLite and PostgreSQL against a bare INSERT.

A batch of the counter (``examples/counter``, Relay's default pipeline) costs the ledger three
transactions: ``prepare_tasks`` (the ranges), the task's write through ``LedgerMessagesSink`` (its
rows, dead letters and ranges, fenced) and ``commit_cursors`` (the cursors and the batch row); here
one task writes the whole batch. The baseline inserts the same message rows in one bare transaction.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

from relay.errors import RelayError

from .context import Context
from .results import figure
from .stats import summarize


class PhaseTimer:
    """Time spent per SQL statement kind and in COMMIT, from SQLAlchemy's cursor events.

    Why from the outside: the protocol's steps are functions; this shows where their time goes (locks,
    lease reads, message inserts, cursor CAS, batch row, commit) without touching their code.
    """

    _TABLE = re.compile(
        r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|BEGIN\w*)\s*(?:.*?\bFROM\s+)?(\w+)?",
        re.IGNORECASE | re.DOTALL,
    )

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.enabled = False

    @classmethod
    def key(cls, statement: str) -> str:
        """``"UPDATE leases SET ..."`` -> ``"UPDATE leases"``; SELECTs are keyed by their first table."""
        m = cls._TABLE.match(statement)
        if not m:
            return statement.split(None, 1)[0].upper() if statement.strip() else "?"
        verb = m.group(1).split()[0].upper()
        table = (m.group(2) or "").strip('"')
        if verb == "BEGIN":
            return "BEGIN"
        return f"{verb} {table}".strip()

    def attach(self, engine: Any) -> None:
        from sqlalchemy import event

        def before(conn: Any, _cursor: Any, _stmt: str, _params: Any, _context: Any, _many: bool) -> None:
            conn.info["bench_t0"] = time.perf_counter()

        def after(conn: Any, _cursor: Any, stmt: str, _params: Any, _context: Any, _many: bool) -> None:
            t0 = conn.info.pop("bench_t0", None)
            if self.enabled and t0 is not None:
                k = self.key(stmt)
                self.totals[k] = self.totals.get(k, 0.0) + (time.perf_counter() - t0) * 1000

        event.listen(engine, "before_cursor_execute", before)
        event.listen(engine, "after_cursor_execute", after)
        dialect = engine.dialect
        original = dialect.do_commit

        def timed_commit(dbapi_connection: Any) -> None:
            t0 = time.perf_counter()
            try:
                original(dbapi_connection)
            finally:
                if self.enabled:
                    self.totals["COMMIT"] = self.totals.get("COMMIT", 0.0) + (time.perf_counter() - t0) * 1000

        dialect.do_commit = timed_commit  # this engine only: a private Ledger of the benchmark


def _ledger_run(url: str, size: int, commits: int, warmup: int, tag: str) -> dict[str, Any]:
    """``commits`` counter batches of ``size`` records each (prepare, one task's sink write, commit);
    and the bare INSERT baseline."""
    from relay.ledger.models import Color
    from relay.ledger.store import Ledger
    from relay.protocol.commit import commit_cursors
    from relay.protocol.prepare import prepare_batch
    from relay.sinks.base import TaskContext
    from relay.sinks.ledger_messages import LedgerMessagesSink, _engine, dispose_engines
    from relay.sinks.ledger_messages_tables import messages

    ledger = Ledger(url, create=True)  # a private ledger of the benchmark
    timer = PhaseTimer()
    timer.attach(ledger.engine)
    timer.attach(_engine(url))  # the sink's own engine (one per process and URL, disposed at the end)
    pipeline = f"ledger-{tag}-{size}-{time.time_ns() % 10**9}"
    topic, parts = "bench", 3
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "bench", Color.BLUE, "", pipeline)
        for p in range(parts):
            ledger.open_lease(conn, inst, topic, p, 0)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    sink = LedgerMessagesSink(url)
    sink.prepare(pipeline)
    pos = dict.fromkeys(range(parts), 0)
    counter = 0
    protocol_ms: list[float] = []
    inside_ms: list[float] = []
    for batch_id in range(commits + warmup):
        start = {topic: dict(pos)}
        rows = []
        for i in range(size):
            p = i % parts
            key = str(counter).encode()
            rows.append({"topic": topic, "partition": p, "offset": pos[p], "key": key, "value": key})
            pos[p] += 1
            counter += 1
        end = {topic: dict(pos)}
        timer.enabled = batch_id >= warmup
        t0 = time.perf_counter()
        ranges = prepare_batch(ledger, attempt, start, end)
        written = sink.write_task(TaskContext(pipeline, inst.id, attempt.epoch, batch_id, ranges), rows)
        result = commit_cursors(ledger, attempt, batch_id, start, end, written)
        elapsed = (time.perf_counter() - t0) * 1000
        if batch_id >= warmup:
            protocol_ms.append(elapsed)
            inside_ms.append(result.commit_ms)
    timer.enabled = False
    phases = {k: v / commits for k, v in sorted(timer.totals.items(), key=lambda kv: -kv[1])}
    phases["python and driver (rest)"] = max(0.0, sum(protocol_ms) / commits - sum(phases.values()))
    # Baseline: the same message rows in one bare transaction (no lock, no leases, no CAS, no batch row).
    bare_ms: list[float] = []
    base_pipeline = pipeline + "-bare"
    for batch_id in range(commits + warmup):
        bare = [
            dict(
                pipeline=base_pipeline,
                topic=topic,
                partition=i % parts,
                offset=batch_id * size + i,
                key=str(i),
                value=str(i),
                instance_id=inst.id,
                version="bench",
                batch_id=batch_id,
            )
            for i in range(size)
        ]
        t0 = time.perf_counter()
        with ledger.tx() as conn:
            conn.execute(messages.insert(), bare)
        if batch_id >= warmup:
            bare_ms.append((time.perf_counter() - t0) * 1000)
    ledger.close()
    dispose_engines()  # the next run attaches its timer to a new engine
    return {
        "protocol_ms": summarize(protocol_ms),
        "inside_tx_ms": summarize(inside_ms),
        "bare_insert_ms": summarize(bare_ms),
        "phases_mean_ms": {k: round(v, 3) for k, v in phases.items()},
    }


def section_ledger(ctx: Context) -> dict[str, Any]:
    from relay_dev.postgres_local import LocalPostgres

    opts = ctx.options
    pg = LocalPostgres(ctx.config.data_dir, ctx.config.ports.postgres, ctx.config.host)
    backends = [("sqlite", f"sqlite:///{ctx.config.data_dir / 'ledger-bench.db'}")]
    figures: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    try:
        ctx.progress(f"ledger: starting PostgreSQL on {pg.address}")
        backends.append(("postgresql", pg.start()))
        for backend, url in backends:
            for size in opts.ledger_sizes:
                ctx.progress(f"ledger: {backend}, {opts.ledger_commits} commits of {size} records")
                r = _ledger_run(url, size, opts.ledger_commits, warmup=5, tag=backend)
                details[f"{backend}/{size}"] = r
                p, b = r["protocol_ms"], r["bare_insert_ms"]
                figures.append(
                    figure(
                        f"{backend} counter batch {size} rec, median",
                        p["median"],
                        "ms",
                        "bare INSERT tx median",
                        b["median"],
                    )
                )
                figures.append(
                    figure(
                        f"{backend} counter batch {size} rec, p95",
                        p["p95"],
                        "ms",
                        "bare INSERT tx p95",
                        b["p95"],
                    )
                )
    finally:
        with contextlib.suppress(RelayError):
            pg.stop()
    return {"figures": figures, "details": details}
