"""Micro-benchmark of the fenced PostgreSQL upsert sink (relay.sinks.postgres_upsert), no Spark.

    .venv/bin/python bench/pg_upsert_sink.py                    # throwaway PostgreSQL under var/bench/
    .venv/bin/python bench/pg_upsert_sink.py --url postgresql://u:p@host:5432/db --rows 100000

Writes ``--rows`` rows (5 columns: bigint key, text, float8, 64-byte bytea, small jsonb) in tasks of
``--task-rows`` through ``write_task`` (one fenced transaction per task, pages of ``--page-size``),
then the same rows again (a replay: nothing may change), and as a baseline the same rows with a bare
``execute_values`` INSERT (no fence, no ON CONFLICT) into a table of the same shape and primary
key, one transaction per task. Prints rows/s for each and the ratio to the baseline. Everything runs
in a schema of its own, dropped at the end; a throwaway server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg2
from psycopg2.extras import execute_values
from relay.config import PROJECT_ROOT
from relay.sinks import pg_conn
from relay.sinks.base import TaskContext
from relay.sinks.postgres_upsert import PostgresUpsertSink

COLUMNS = {"id": "bigint", "name": "text", "amount": "double precision", "body": "bytea", "doc": "jsonb"}
TOPIC, PARTITIONS = "bench", 4


def make_rows(n: int) -> list[dict]:
    body = os.urandom(64)
    return [
        {
            "id": i,
            "name": f"customer-{i}",
            "amount": i * 0.25,
            "body": body,
            "doc": {"n": i, "tags": ["a", "b"]},
            "topic": TOPIC,
            "partition": i % PARTITIONS,
            "offset": i // PARTITIONS,
        }
        for i in range(n)
    ]


def run(url: str, rows_n: int, task_rows: int, page_size: int) -> None:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(pg_conn.libpq_url(url))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE SCHEMA "{schema}"')
    try:
        sink = PostgresUpsertSink(url, "items", ["id"], list(COLUMNS), schema=schema, page_size=page_size)
        sink.create_table(COLUMNS)
        sink.prepare("bench")
        sink.fence_epoch("bench", 1, 1)
        rows = make_rows(rows_n)
        tasks = [rows[i : i + task_rows] for i in range(0, rows_n, task_rows)]
        ctx = TaskContext("bench", 1, 1, 0, {(TOPIC, p): (0, rows_n) for p in range(PARTITIONS)})

        def write_all() -> tuple[float, int, int]:
            t0 = time.perf_counter()
            written = unchanged = 0
            for task in tasks:
                result = sink.write_task(ctx, task)
                written, unchanged = written + result.rows_written, unchanged + result.rows_unchanged
            return time.perf_counter() - t0, written, unchanged

        first_s, first_written, _ = write_all()
        replay_s, replay_written, replay_unchanged = write_all()
        assert first_written == rows_n, first_written
        assert (replay_written, replay_unchanged) == (0, rows_n), (replay_written, replay_unchanged)

        with admin.cursor() as cur:
            cur.execute(f'CREATE TABLE "{schema}".bare (LIKE "{schema}".items INCLUDING ALL)')
        names = [*COLUMNS, "_relay_topic", "_relay_partition", "_relay_offset"]
        insert = f'INSERT INTO "{schema}".bare ({", ".join(names)}) VALUES %s'
        conn = psycopg2.connect(pg_conn.libpq_url(url))
        t0 = time.perf_counter()
        for task in tasks:
            with conn.cursor() as cur:
                values = [
                    (
                        r["id"],
                        r["name"],
                        r["amount"],
                        psycopg2.Binary(r["body"]),
                        psycopg2.extras.Json(r["doc"]),
                        r["topic"],
                        r["partition"],
                        r["offset"],
                    )
                    for r in task
                ]
                execute_values(cur, insert, values, page_size=page_size)
            conn.commit()
        bare_s = time.perf_counter() - t0
        conn.close()
    finally:
        pg_conn.close_all()
        with admin.cursor() as cur:
            cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()

    def line(what: str, seconds: float) -> str:
        rate = rows_n / seconds
        return f"{what:<34} {seconds:7.2f} s  {rate:10,.0f} rows/s  {rate / (rows_n / bare_s):5.2f}x"

    print(f"{rows_n:,} rows in tasks of {task_rows:,}, pages of {page_size:,}; load {os.getloadavg()[0]:.2f}")
    print(line("upsert sink, first write", first_s))
    print(line("upsert sink, replay (0 written)", replay_s))
    print(line("baseline: bare INSERT, same pages", bare_s))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="an existing PostgreSQL (default: a throwaway one under var/bench/)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--task-rows", type=int, default=10_000)
    parser.add_argument("--page-size", type=int, default=2_000)
    args = parser.parse_args()
    if args.url:
        run(args.url, args.rows, args.task_rows, args.page_size)
        return 0
    from relay_dev.postgres_local import LocalPostgres  # developer tooling: only for the throwaway server

    from tests.conftest import free_port

    base = PROJECT_ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="pg-upsert-", dir=base))
    data_dir.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    pg = LocalPostgres(data_dir, free_port())
    try:
        url = pg.start()
        run(url, args.rows, args.task_rows, args.page_size)
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
