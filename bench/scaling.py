"""How Relay's per-batch cost grows with partitions, and the audit's with offsets (issue: cost that
stays flat as partitions grow).

Three measurements, each on a private ledger under --work-dir (no Spark; a Kafka broker only for the
offsets lookup, started from noida-db on a free loopback port unless --no-kafka):

* commit:   the driver's ledger work of one batch advancing every partition by one record
            (``relay.protocol``'s ``prepare_batch`` then ``commit_cursors``; the sink's writes are the
            tasks'), with 1, 32, 256 and 1,024 partitions (1..1,024 leases locked, ranged, advanced by CAS);
* planning: what the source does before every batch: the ledger guard (``read_source_guard``: the
            instance and its leases) and the pure plan (``plan_batch_end`` with the caps and the read
            limit), plus Kafka's earliest/latest offsets of the topic (a broker round trip);
* audit:    the shallow audit (SQL aggregates over lease ranges) with 10^4, 10^6 and 10^7 applied
            offsets, and the deep audit's comparison walk over the same offsets. The walk is fed
            the committed-record offsets as a stream here, so the figure is Relay's own cost; reading
            the records from Kafka adds the broker's read rate (see `relay bench`'s throughput).

    .venv/bin/python bench/scaling.py                       # SQLite ledger, ~3-6 min on 2 cores
    .venv/bin/python bench/scaling.py --postgres-url URL     # the same on PostgreSQL
    .venv/bin/python bench/scaling.py --quick                # smaller sizes (10^4, 10^5 offsets)

Prints a table per measurement with the growth factor between sizes (ideal: flat for the audit's
per-offset cost, and linear in partitions for the commit and the planning).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "spark_jobs"))

TOPIC = "scale"


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Median and p95 in ms of ``repeat`` calls (after one warm-up call)."""
    fn()
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    return {"median_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3)}


def private_ledger(url: str | None, work: Path, name: str) -> str:
    if url:
        return url
    return f"sqlite:///{work / (name + '.db')}"


def bench_commit(url: str, partitions: int, commits: int) -> dict[str, float]:
    from relay.ledger.models import Color
    from relay.ledger.store import Ledger
    from relay.protocol import commit_cursors, prepare_batch
    from relay.sinks.base import TaskResult

    ledger = Ledger(url, create=True)
    pipeline = f"commit-{partitions}-{time.time_ns() % 10**9}"
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "bench", Color.BLUE, "", pipeline)
        for p in range(partitions):
            ledger.open_lease(conn, inst, TOPIC, p, 0)
    attempt = ledger.start_attempt(inst.id, ledger.issue_launch_token(inst.id))
    counts = TaskResult(rows_in=partitions, rows_written=partitions)  # what the tasks would return
    state = {"batch": 0, "pos": 0}

    def one() -> None:
        pos = state["pos"]
        start = {TOPIC: dict.fromkeys(range(partitions), pos)}
        end = {TOPIC: dict.fromkeys(range(partitions), pos + 1)}
        prepare_batch(ledger, attempt, start, end)
        commit_cursors(ledger, attempt, state["batch"], start, end, counts)
        state["batch"] += 1
        state["pos"] += 1

    try:
        return timed(one, commits)
    finally:
        ledger.close()


def bench_planning(url: str, partitions: int, repeat: int, bootstrap: str | None) -> dict[str, Any]:
    from kafka_offsets_plan import plan_batch_end
    from relay.ledger.models import Color
    from relay.ledger.store import Ledger
    from relay.protocol.guard import read_source_guard

    ledger = Ledger(url, create=True)
    pipeline = f"plan-{partitions}-{time.time_ns() % 10**9}"
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "bench", Color.BLUE, "", pipeline)
        for p in range(partitions):
            ledger.open_lease(conn, inst, TOPIC, p, 0, 10**6 if p % 2 else None)
    begin = {(TOPIC, p): 100 for p in range(partitions)}
    earliest = {(TOPIC, p): 0 for p in range(partitions)}
    latest = {(TOPIC, p): 50_000 for p in range(partitions)}

    def guard_and_plan() -> None:
        guard = read_source_guard(url, inst.id)
        plan_batch_end(begin, earliest, latest, fail_on_data_loss=True, caps=guard.caps, max_rows=20_000)

    out: dict[str, Any] = {"guard_and_plan": timed(guard_and_plan, repeat)}
    if bootstrap:
        from relay.kafka.offsets import KafkaOffsets

        topic = f"{TOPIC}-{partitions}"
        with KafkaOffsets(bootstrap, timeout_s=30) as kafka:
            kafka.ensure_topic(topic, partitions)
            out["kafka_offsets"] = timed(lambda: (kafka.earliest(topic), kafka.latest(topic)), repeat)
    ledger.close()
    return out


def fill_audit_ledger(url: str, offsets: int, partitions: int = 8) -> tuple[str, dict[int, int]]:
    """A ledger whose one instance of the counter applied ``offsets`` offsets (its sink's rows written
    in bulk, as its tasks would, with one recorded range per partition and the running count)."""
    from relay.ledger import schema as s
    from relay.ledger.models import Color
    from relay.ledger.store import Ledger
    from relay.sinks import ledger_messages_tables as counter

    ledger = Ledger(url, create=True)
    pipeline = f"audit-{offsets}"
    per = offsets // partitions
    with ledger.tx() as conn:
        inst = ledger.create_instance(conn, pipeline, "bench", Color.BLUE, "", pipeline)
        counter.create_tables(conn, pipeline)
        for p in range(partitions):
            lease = ledger.open_lease(conn, inst, TOPIC, p, 0)
            conn.execute(s.leases.update().where(s.leases.c.id == lease.id).values(next_offset=per))
        run = {"pipeline": pipeline, "topic": TOPIC, "instance_id": inst.id, "epoch": 1, "batch_id": 0}
        conn.execute(
            counter.message_ranges.insert(),
            [
                {**run, "partition": p, "start_offset": 0, "end_offset": per, "created_at": time.time()}
                for p in range(partitions)
            ],
        )
        conn.execute(
            counter.counter_totals.update()
            .where(counter.counter_totals.c.pipeline == pipeline)
            .values(message_count=per * partitions)
        )
    ledger.close()

    def rows() -> Iterator[tuple[Any, ...]]:
        for p in range(partitions):
            for o in range(per):
                yield (pipeline, TOPIC, p, o, str(o), str(o), inst.id, "bench", 0)

    cols = "pipeline, topic, partition, offset, key, value, instance_id, version, batch_id"
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        with db:
            db.executemany(f"INSERT INTO messages ({cols}) VALUES (?,?,?,?,?,?,?,?,?)", rows())
        db.close()
    else:
        import psycopg2
        from psycopg2.extras import execute_values
        from sqlalchemy.engine import make_url

        u = make_url(url)
        db = psycopg2.connect(
            host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database
        )
        with db, db.cursor() as cur:
            execute_values(cur, f"INSERT INTO messages ({cols}) VALUES %s", rows(), page_size=10_000)
        db.close()
    return pipeline, dict.fromkeys(range(partitions), per)


def bench_audit(url: str, offsets: int) -> dict[str, Any]:
    from relay.audit import audit_ledger
    from relay.ledger.store import Ledger

    t0 = time.perf_counter()
    pipeline, ends = fill_audit_ledger(url, offsets)
    fill_s = time.perf_counter() - t0
    latest = dict(ends)  # partition -> offset, as KafkaOffsets.latest(topic) returns it
    earliest = dict.fromkeys(ends, 0)
    ledger = Ledger(url)
    try:
        t0 = time.perf_counter()
        shallow = audit_ledger(ledger, pipeline, TOPIC, lambda: (earliest, latest))
        shallow_s = time.perf_counter() - t0
        assert shallow.ok, shallow.to_json()
        t0 = time.perf_counter()
        deep = audit_ledger(
            ledger, pipeline, TOPIC, lambda: (earliest, latest), records=lambda p, a, b: range(a, b)
        )
        deep_s = time.perf_counter() - t0
        assert deep.ok, deep.to_json()
    finally:
        ledger.close()
    return {
        "offsets": offsets,
        "fill_s": round(fill_s, 2),
        "shallow_s": round(shallow_s, 3),
        "deep_walk_s": round(deep_s, 3),
        "deep_us_per_offset": round(deep_s / offsets * 1e6, 3),
    }


@contextmanager
def broker(work: Path, enabled: bool) -> Iterator[str | None]:
    """A private noida-db broker on a free loopback port (stopped by PID), or None."""
    if not enabled:
        yield None
        return
    from relay_dev.bench import free_port
    from relay_dev.stack_setup import noida_binary

    port = free_port("127.0.0.1")
    data = work / "kafka"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [str(noida_binary()), "start", "--only", "kafka", "--host", "127.0.0.1"]
    cmd += ["--kafka-port", str(port), "--data-dir", str(data)]
    with open(work / "kafka.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        from relay.kafka.offsets import KafkaOffsets

        deadline = time.monotonic() + 60
        while True:
            try:
                with KafkaOffsets(f"127.0.0.1:{port}", timeout_s=2) as kafka:
                    kafka.topics()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(2)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def growth(rows: list[dict[str, Any]], size_key: str, value_key: str) -> None:
    for prev, cur in zip(rows, rows[1:], strict=False):
        size_x = cur[size_key] / prev[size_key]
        cost_x = cur[value_key] / prev[value_key] if prev[value_key] else float("inf")
        cur["growth"] = f"x{cost_x:.1f} for x{size_x:.0f} size"


def table(rows: list[dict[str, Any]], cols: list[str], title: str) -> str:
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    out = [title, "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    out += ["  ".join(str(r.get(c, "")).rjust(w) for c, w in zip(cols, widths, strict=True)) for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--postgres-url", help="a PostgreSQL database to use as the ledger (default: SQLite files)"
    )
    ap.add_argument("--work-dir", type=Path, default=ROOT / "var" / "bench" / "scaling")
    ap.add_argument("--quick", action="store_true", help="audit with 10^4 and 10^5 offsets, fewer repeats")
    ap.add_argument("--no-kafka", action="store_true", help="skip the broker's offsets lookup")
    a = ap.parse_args(argv)
    work = a.work_dir / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    repeat = 20 if a.quick else 50
    sizes = [10**4, 10**5] if a.quick else [10**4, 10**6, 10**7]
    result: dict[str, Any] = {"ledger": "postgresql" if a.postgres_url else "sqlite"}

    commit_rows = []
    for n in (1, 32, 256, 1024):
        print(f"commit with {n} partition(s) ...", file=sys.stderr, flush=True)
        url = private_ledger(a.postgres_url, work, f"commit-{n}")
        commit_rows.append({"partitions": n, **bench_commit(url, n, repeat)})
    growth(commit_rows, "partitions", "median_ms")
    result["commit"] = commit_rows

    plan_rows = []
    with broker(work, not a.no_kafka) as bootstrap:
        for n in (1, 32, 256, 1024):
            print(f"planning with {n} partition(s) ...", file=sys.stderr, flush=True)
            url = private_ledger(a.postgres_url, work, f"plan-{n}")
            got = bench_planning(url, n, repeat, bootstrap)
            row = {"partitions": n, "guard_and_plan_ms": got["guard_and_plan"]["median_ms"]}
            if "kafka_offsets" in got:
                row["kafka_offsets_ms"] = got["kafka_offsets"]["median_ms"]
            plan_rows.append(row)
    growth(plan_rows, "partitions", "guard_and_plan_ms")
    result["planning"] = plan_rows

    audit_rows = []
    for size in sizes:
        print(f"audit of {size:,} offsets ...", file=sys.stderr, flush=True)
        url = private_ledger(a.postgres_url, work, f"audit-{size}")
        audit_rows.append(bench_audit(url, size))
    growth(audit_rows, "offsets", "shallow_s")
    result["audit"] = audit_rows

    (work / "results.json").write_text(json.dumps(result, indent=2))
    print(
        table(commit_rows, ["partitions", "median_ms", "p95_ms", "growth"], f"\ncommit ({result['ledger']})")
    )
    plan_cols = ["partitions", "guard_and_plan_ms", "kafka_offsets_ms", "growth"]
    print(table(plan_rows, plan_cols, "\nplanning (per batch)"))
    audit_cols = ["offsets", "shallow_s", "deep_walk_s", "deep_us_per_offset", "growth"]
    print(table(audit_rows, audit_cols, "\naudit"))
    print(f"\nresults: {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
