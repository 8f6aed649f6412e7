"""The fenced PostgreSQL upsert sink on a real PostgreSQL: fencing races, newest wins, clear errors.

Each test works in a schema of its own. Concurrency is driven by real locks (an open transaction in
another connection) and observed in pg_stat_activity, never by sleeping.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from relay.errors import ConfigError
from relay.sinks import pg_conn
from relay.sinks.base import FencedWriteError, SinkError, SinkUnavailableError, TaskContext, TaskResult
from relay.sinks.postgres_upsert import PostgresUpsertSink

from tests.conftest import Background, wait_for

pytestmark = pytest.mark.integration

TOPIC = "orders"
COLUMNS = {"id": "bigint", "name": "text", "amount": "double precision", "body": "bytea", "doc": "jsonb"}
EVERYTHING = {(TOPIC, p): (0, 10**9) for p in range(4)}


def connect(url: str) -> psycopg2.extensions.connection:
    return psycopg2.connect(pg_conn.libpq_url(url))


@pytest.fixture()
def schema(postgres_url: str) -> Iterator[str]:
    name = f"s_{uuid.uuid4().hex[:10]}"
    admin = connect(postgres_url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE SCHEMA "{name}"')
    yield name
    pg_conn.close_all()
    with admin.cursor() as cur:
        cur.execute(f'DROP SCHEMA "{name}" CASCADE')
    admin.close()


def make_sink(url: str, schema: str, create: bool = True, **kwargs: Any) -> PostgresUpsertSink:
    sink = PostgresUpsertSink(url, "items", ["id"], list(COLUMNS), schema=schema, **kwargs)
    if create:
        sink.create_table(COLUMNS)
    sink.prepare("pipe")
    return sink


def ctx(epoch: int, instance: int = 1, ranges: dict | None = None, batch: int = 0) -> TaskContext:
    return TaskContext("pipe", instance, epoch, batch, EVERYTHING if ranges is None else ranges)


def row(id_: int, offset: int, partition: int = 0, name: str | None = None, **extra: Any) -> dict:
    values = {"id": id_, "name": name or f"n{id_}@{partition}:{offset}", "amount": None, "body": None}
    return {"doc": None, **values, **extra, "topic": TOPIC, "partition": partition, "offset": offset}


def contents(url: str, schema: str) -> dict[int, tuple]:
    """What a user sees: id -> (name, partition, offset)."""
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT id, name, _relay_partition, _relay_offset FROM "{schema}".items ORDER BY id')
        return {r[0]: r[1:] for r in cur.fetchall()}


def lock_waiters(url: str, like: str) -> list[tuple[int, list[int]]]:
    """(pid, blocking pids) of sessions waiting on a lock whose query contains ``like``."""
    with connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND query LIKE %s",
            (f"%{like}%",),
        )
        return [(pid, list(blockers)) for pid, blockers in cur.fetchall()]


def test_fence_epoch_waits_for_a_task_in_its_write_and_then_no_old_task_commits(
    postgres_url: str, schema: str
) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    # Another transaction holds key 1 (uncommitted insert): the task of epoch 5 will stop INSIDE its
    # write, after reading the fence row FOR SHARE, until that transaction ends.
    blocker = connect(postgres_url)
    with blocker.cursor() as cur:
        cur.execute(
            f'INSERT INTO "{schema}".items (id, name, _relay_topic, _relay_partition, _relay_offset)'
            " VALUES (1, 'blocker', %s, 0, 0)",
            (TOPIC,),
        )
    task = Background(lambda: sink.write_task(ctx(5), [row(1, 10), row(2, 11)]))
    task.start()
    fence = None
    try:
        wait_for(
            "the task of epoch 5 to wait inside its write",
            lambda: lock_waiters(postgres_url, f'"{schema}"."items"'),
            30,
        )
        [(task_pid, _)] = lock_waiters(postgres_url, f'"{schema}"."items"')
        fence = Background(lambda: sink.fence_epoch("pipe", 1, 6))
        fence.start()
        wait_for(
            "fence_epoch to wait for the task's share lock on the fence row",
            lambda: lock_waiters(postgres_url, "FOR UPDATE") or not fence.is_alive(),
            30,
        )
        assert fence.is_alive(), f"fence_epoch did not wait for the task in flight: {fence.error!r}"
        [(fence_pid, blockers)] = lock_waiters(postgres_url, "FOR UPDATE")
        assert task_pid in blockers and fence_pid != task_pid
    finally:
        blocker.rollback()
        blocker.close()
    task.join(30)
    assert fence is not None
    fence.join(30)
    assert not task.is_alive() and not fence.is_alive()
    # The task read the fence before fence_epoch and committed before it returned: legitimately.
    assert task.error is None and isinstance(task.result, TaskResult)
    assert task.result.rows_written == 2
    assert fence.error is None
    before = contents(postgres_url, schema)
    assert set(before) == {1, 2}
    # After fence_epoch returned, a task of epoch 5 commits nothing.
    with pytest.raises(FencedWriteError, match="at epoch 6"):
        sink.write_task(ctx(5), [row(3, 12), row(1, 50)])
    assert contents(postgres_url, schema) == before
    assert sink.write_task(ctx(6), [row(3, 12)]).rows_written == 1
    assert set(contents(postgres_url, schema)) == {1, 2, 3}


def test_a_task_that_waits_for_a_fence_in_progress_sees_the_new_epoch(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    fencer = connect(postgres_url)  # a fence in progress: the row locked exclusively, epoch moved
    with fencer.cursor() as cur:
        cur.execute(f'UPDATE "{schema}".relay_sink_fences SET epoch = 6 WHERE instance_id = 1')
    task = Background(lambda: sink.write_task(ctx(5), [row(1, 10)]))
    task.start()
    try:
        wait_for(
            "the task to wait for the fence row",
            lambda: lock_waiters(postgres_url, "FOR SHARE") or not task.is_alive(),
            30,
        )
        assert task.is_alive(), f"the task did not wait for the fence: {task.error or task.result}"
    finally:
        fencer.commit()
        fencer.close()
    task.join(30)
    assert isinstance(task.error, FencedWriteError)
    assert contents(postgres_url, schema) == {}


def test_fenced_instance_and_stale_epochs_are_refused(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    with pytest.raises(FencedWriteError, match="fence_epoch never ran"):
        sink.write_task(ctx(5), [row(1, 10)])
    sink.fence_epoch("pipe", 1, 5)
    sink.fence_epoch("pipe", 1, 5)  # the same epoch again: a no-op
    sink.fence_epoch("pipe", 2, 3)  # another instance has a row of its own
    with pytest.raises(FencedWriteError, match="newer epoch 5"):
        sink.fence_epoch("pipe", 1, 4)
    with pytest.raises(FencedWriteError, match="at epoch 5"):
        sink.write_task(ctx(4), [row(1, 10)])
    assert sink.write_task(ctx(5), [row(1, 10)]).rows_written == 1
    sink.fence_instance("pipe", 1)
    sink.fence_instance("pipe", 1)  # idempotent
    with pytest.raises(FencedWriteError, match="fenced"):
        sink.write_task(ctx(5), [row(1, 20), row(2, 21)])
    with pytest.raises(FencedWriteError, match="fenced"):
        sink.fence_epoch("pipe", 1, 9)
    assert sink.write_task(ctx(3, instance=2), [row(2, 30)]).rows_written == 1
    assert contents(postgres_url, schema) == {1: ("n1@0:10", 0, 10), 2: ("n2@0:30", 0, 30)}


@pytest.mark.parametrize("green_first", [True, False])
def test_newest_wins_whichever_commits_first(postgres_url: str, schema: str, green_first: bool) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)  # blue
    sink.fence_epoch("pipe", 2, 6)  # green
    green = lambda: sink.write_task(ctx(6, instance=2), [row(7, 120, name="green")])  # noqa: E731
    blue = lambda: sink.write_task(ctx(5, instance=1), [row(7, 100, name="blue")])  # noqa: E731
    first, second = (green, blue) if green_first else (blue, green)
    assert first().rows_written == 1
    late = second()
    assert contents(postgres_url, schema) == {7: ("green", 0, 120)}
    assert (late.rows_written, late.rows_unchanged) == ((0, 1) if green_first else (1, 0))


def test_the_order_across_partitions_is_deterministic_not_by_time(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    sink.write_task(ctx(5), [row(1, 500, partition=0, name="p0")])
    sink.write_task(ctx(5), [row(1, 3, partition=1, name="p1")])
    sink.write_task(ctx(5), [row(1, 900, partition=0, name="p0-later")])
    assert contents(postgres_url, schema) == {1: ("p1", 1, 3)}


def test_duplicates_in_a_task_keep_the_highest_position(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    result = sink.write_task(ctx(5), [row(1, 10), row(1, 30), row(2, 5), row(1, 20)])
    assert (result.rows_in, result.rows_written, result.rows_unchanged) == (4, 2, 2)
    assert result.extra["superseded_in_task"] == 2
    assert contents(postgres_url, schema) == {1: ("n1@0:30", 0, 30), 2: ("n2@0:5", 0, 5)}


def test_a_replay_writes_nothing_new(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema, page_size=7)  # several pages
    sink.fence_epoch("pipe", 1, 5)
    rows = [row(i % 40, i, partition=i % 2) for i in range(100)]
    first = sink.write_task(ctx(5), rows)
    assert (first.rows_written, first.rows_unchanged, first.extra["inserted"]) == (40, 60, 40)
    after_first = contents(postgres_url, schema)
    assert len(after_first) == 40
    replay = sink.write_task(ctx(5, batch=1), rows)
    assert (replay.rows_in, replay.rows_written, replay.rows_unchanged) == (100, 0, 100)
    assert contents(postgres_url, schema) == after_first


def test_rows_outside_the_ranges_are_skipped(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    ranges = {(TOPIC, 0): (10, 20)}
    rows = [row(1, 9), row(2, 10), row(3, 19), row(4, 20), row(5, 15, partition=1)]
    rows.append({**row(6, 15), "topic": "elsewhere"})
    result = sink.write_task(ctx(5, ranges=ranges), rows)
    assert (result.rows_in, result.rows_written, result.rows_skipped) == (6, 2, 4)
    assert set(contents(postgres_url, schema)) == {2, 3}
    nothing = sink.write_task(ctx(5, ranges={}), rows)
    assert (nothing.rows_skipped, nothing.rows_written) == (6, 0)


def test_values_round_trip_and_a_bad_value_names_its_column(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    doc = {"a": [1, 2, {"b": None}], "é": "ü"}
    sink.write_task(ctx(5), [row(1, 1, amount=2.5, body=b"\x00\xffbin", doc=doc), row(2, 2, doc=[1, "x"])])
    with connect(postgres_url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT id, amount, body, doc FROM "{schema}".items ORDER BY id')
        got = [(i, a, None if b is None else bytes(b), d) for i, a, b, d in cur.fetchall()]
    assert got == [(1, 2.5, b"\x00\xffbin", doc), (2, None, None, [1, "x"])]
    with pytest.raises(SinkError, match="column 'amount'") as info:
        sink.write_task(ctx(5), [row(3, 3, amount=1.0), row(4, 4, amount="not a number")])
    assert "not a number" in str(info.value)
    with pytest.raises(SinkError, match="column 'body'"):
        sink.write_task(ctx(5), [row(5, 5, body={"not": "bytes"})])
    assert set(contents(postgres_url, schema)) == {1, 2}


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("", "does not exist"),
        (
            "CREATE TABLE {t} (id bigint PRIMARY KEY, name text, amount float8, body bytea, doc jsonb)",
            "_relay_topic text is missing",
        ),
        (
            "CREATE TABLE {t} (id bigint, name text, amount float8, body bytea, doc jsonb,"
            " _relay_topic text, _relay_partition int, _relay_offset bigint)",
            "no unique index or primary key on exactly the key columns",
        ),
        (
            "CREATE TABLE {t} (id bigint, name text, amount float8, body bytea, doc jsonb,"
            " _relay_topic text, _relay_partition int, _relay_offset bigint, PRIMARY KEY (id, name))",
            "no unique index or primary key on exactly the key columns",
        ),
        (
            "CREATE TABLE {t} (id bigint PRIMARY KEY, amount float8, body bytea, doc jsonb,"
            " _relay_topic text, _relay_partition int, _relay_offset int)",
            r"columns \['name'\] are missing.*_relay_offset is integer",
        ),
    ],
)
def test_a_target_that_breaks_the_contract_is_named_and_nothing_is_written(
    postgres_url: str, schema: str, ddl: str, message: str
) -> None:
    if ddl:
        with connect(postgres_url) as conn, conn.cursor() as cur:
            cur.execute(ddl.format(t=f'"{schema}".items'))
    sink = PostgresUpsertSink(postgres_url, "items", ["id"], list(COLUMNS), schema=schema)
    with pytest.raises(ConfigError, match=message):
        sink.prepare("pipe")
    sink.fence_epoch("pipe", 1, 5)  # the fence table exists: prepare creates it before the checks
    with pytest.raises(ConfigError):  # an executor that writes anyway gets a clear error too
        sink.write_task(ctx(5), [row(1, 10)])
    if ddl:
        with connect(postgres_url) as conn, conn.cursor() as cur:
            cur.execute(f'SELECT count(*) FROM "{schema}".items')
            assert cur.fetchone()[0] == 0


def test_a_unique_index_on_the_key_is_enough_and_columns_may_come_from_the_rows(
    postgres_url: str, schema: str
) -> None:
    with connect(postgres_url) as conn, conn.cursor() as cur:
        cur.execute(
            f'CREATE TABLE "{schema}".events (k1 text, k2 int, v jsonb, _relay_topic varchar(200),'
            " _relay_partition bigint, _relay_offset bigint, extra text DEFAULT 'kept')"
        )
        cur.execute(f'CREATE UNIQUE INDEX ON "{schema}".events (k2, k1)')
    sink = PostgresUpsertSink(postgres_url, "events", ["k1", "k2"], schema=schema)
    sink.prepare("pipe")
    sink.fence_epoch("pipe", 1, 1)
    rows = [
        {"k1": "a", "k2": 1, "v": {"n": i}, "topic": TOPIC, "partition": 0, "offset": i} for i in range(3)
    ]
    assert sink.write_task(ctx(1), rows).rows_written == 1
    with connect(postgres_url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT k1, k2, v, _relay_offset, extra FROM "{schema}".events')
        assert cur.fetchall() == [("a", 1, {"n": 2}, 2, "kept")]


def test_a_broken_pooled_connection_is_replaced(postgres_url: str, schema: str) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", 1, 5)
    sink.write_task(ctx(5), [row(1, 1)])
    with connect(postgres_url) as conn, conn.cursor() as cur:  # e.g. a server restart
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (pg_conn.APPLICATION_NAME,),
        )
    assert sink.write_task(ctx(5), [row(2, 2)]).rows_written == 1
    assert set(contents(postgres_url, schema)) == {1, 2}


def test_the_password_never_shows(postgres_url: str, schema: str) -> None:
    password = f"Pw-{uuid.uuid4().hex[:8]}@:/x"
    role = f"r_{uuid.uuid4().hex[:8]}"
    encoded = password.replace("@", "%40").replace(":", "%3A").replace("/", "%2F")
    with connect(postgres_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN PASSWORD %s", (password,))
        cur.execute(f'GRANT ALL ON SCHEMA "{schema}" TO {role}')
    base = postgres_url.split("@", 1)[1]
    good = f"postgresql://{role}:{encoded}@{base}"
    bad = f"postgresql://{role}:{encoded}WRONG@{base}"
    unencoded = f"postgresql://{role}:{password}@{base}"
    seen: list[str] = []

    def shown(exc: BaseException) -> None:
        seen.append("".join(traceback.format_exception(exc)))

    try:
        for url in (bad, unencoded):
            sink = PostgresUpsertSink(url, "items", ["id"], list(COLUMNS), schema=schema)
            seen.extend([repr(sink), str(sink), sink.url])
            with pytest.raises((SinkUnavailableError, ConfigError)) as info:
                sink.prepare("pipe")
            shown(info.value)
        sink = PostgresUpsertSink(good, "items", ["id"], list(COLUMNS), schema=schema)
        with pytest.raises(ConfigError, match="does not exist") as info:
            sink.prepare("pipe")
        shown(info.value)
        with pytest.raises(FencedWriteError) as info:
            sink.write_task(ctx(5), [row(1, 1)])
        shown(info.value)
        seen.append(repr(sink))
    finally:
        pg_conn.close_all()
        with connect(postgres_url) as conn, conn.cursor() as cur:
            cur.execute(f'REVOKE ALL ON SCHEMA "{schema}" FROM {role}')
            cur.execute(f"DROP OWNED BY {role}")
            cur.execute(f"DROP ROLE {role}")
    assert any("password authentication failed" in s for s in seen)
    for text in seen:
        for secret in (password, encoded, password.split("@")[0] + "@"):
            assert secret not in text, text
