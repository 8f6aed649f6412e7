"""The executor-side messages sink on a real ledger: SQLite, and PostgreSQL (a throwaway server).

Each test works on a pipeline of its own. What the audit counts is read back with SQL: how many
``messages`` rows and dead letters each offset has (the table has no unique key, so a broken range
check shows up here as an offset with two rows). Concurrency on PostgreSQL is driven by real locks
(a session holding the partition's advisory lock) and observed in pg_stat_activity, never by sleeping.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relay.config import PROJECT_ROOT
from relay.errors import ConfigError
from relay.ledger import schema as s
from relay.ledger.engine import create_ledger
from relay.ledger.models import Attempt, Color, Instance, InstanceState
from relay.ledger.store import Ledger
from relay.sinks import ledger_messages as lm
from relay.sinks import ledger_messages_tables as counter
from relay.sinks.base import FencedWriteError, TaskContext, TaskResult
from relay.sinks.ledger_messages import LedgerMessagesSink, runs
from sqlalchemy import func, select, text

from tests.conftest import Background, free_port, wait_for

T = "experience"


@pytest.fixture(scope="module")
def postgres_ledger() -> Iterator[str]:
    from relay_dev.postgres_local import LocalPostgres

    base = PROJECT_ROOT / "var" / "pytest"
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="lm-pg-", dir=base))
    folder.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    pg = LocalPostgres(folder, free_port())
    try:
        url = pg.start()
        create_ledger(url)
        yield url
    finally:
        lm.dispose_engines()
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        yield request.getfixturevalue("postgres_ledger")
    else:
        found = f"sqlite:///{tmp_path / 'ledger.db'}"
        create_ledger(found)
        yield found
    lm.dispose_engines()


@pytest.fixture()
def ledger(url: str) -> Iterator[Ledger]:
    led = Ledger(url)
    yield led
    led.close()


class Run:
    """One pipeline of its own: an instance with leases on partitions 0-2 and a current attempt."""

    def __init__(self, ledger: Ledger, url: str) -> None:
        self.ledger, self.pipeline = ledger, f"p{uuid.uuid4().hex[:8]}"
        with ledger.tx() as conn:
            self.instance: Instance = ledger.create_instance(
                conn, self.pipeline, "v1", Color.BLUE, "/nonexistent", f"relay-{self.pipeline}"
            )
            for partition in range(3):
                ledger.open_lease(conn, self.instance, T, partition, 0)
        self.attempt: Attempt = self.new_attempt()
        self.sink = LedgerMessagesSink(url)
        self.sink.prepare(self.pipeline)
        self.sink.fence_epoch(self.pipeline, self.instance.id, self.attempt.epoch)

    def new_attempt(self) -> Attempt:
        token = self.ledger.issue_launch_token(self.instance.id)
        return self.ledger.start_attempt(self.instance.id, token)

    def ctx(self, ranges: dict | None = None, attempt: Attempt | None = None, batch: int = 0) -> TaskContext:
        epoch = (attempt or self.attempt).epoch
        every = {(T, p): (0, 10**9) for p in range(3)}
        return TaskContext(self.pipeline, self.instance.id, epoch, batch, every if ranges is None else ranges)

    def write(self, offsets: list[int], partition: int = 0, **kwargs: Any) -> TaskResult:
        return self.sink.write_task(self.ctx(**kwargs), [record(o, partition) for o in offsets])

    def per_offset(self, table: str = "messages") -> dict[tuple[int, int], int]:
        """(partition, offset) -> rows there, for this pipeline."""
        t = s.dead_letters if table == "dead_letters" else counter.metadata.tables[table]
        with self.ledger.tx() as conn:
            rows = conn.execute(
                select(t.c.partition, t.c.offset, func.count())
                .where(t.c.pipeline == self.pipeline)
                .group_by(t.c.partition, t.c.offset)
            ).all()
        return {(p, o): n for p, o, n in rows}

    def count(self) -> int:
        with self.ledger.tx() as conn:
            q = select(counter.counter_totals.c.message_count).where(
                counter.counter_totals.c.pipeline == self.pipeline
            )
            return int(conn.execute(q).scalar_one())

    def ranges(self, partition: int = 0) -> list[tuple[int, int]]:
        r = counter.message_ranges
        with self.ledger.tx() as conn:
            q = select(r.c.start_offset, r.c.end_offset).where(
                r.c.pipeline == self.pipeline, r.c.partition == partition
            )
            return sorted(conn.execute(q).all())


COUNTER = object()  # record(): the key is the record's counter


def record(offset: int, partition: int = 0, key: Any = COUNTER) -> dict[str, Any]:
    key = str(1000 * partition + offset).encode() if key is COUNTER else key
    return {"topic": T, "partition": partition, "offset": offset, "key": key, "value": key}


def once(*spans: tuple[int, int], partition: int = 0) -> dict[tuple[int, int], int]:
    return {(partition, o): 1 for a, b in spans for o in range(a, b)}


def test_runs_never_span_an_offset_that_was_not_written() -> None:
    assert runs([3, 1, 2, 7, 9, 8]) == [(1, 4), (7, 10)]
    assert runs([]) == []


def test_rows_inside_the_ranges_become_messages_and_poison_a_dead_letter(ledger: Ledger, url: str) -> None:
    run = Run(ledger, url)
    rows = [record(o) for o in range(10)] + [record(10, key=b"-1"), record(11, key=None)]
    ranges = {(T, 0): (2, 12)}
    result = run.sink.write_task(run.ctx(ranges), rows)
    assert (result.rows_in, result.rows_written, result.rows_skipped, result.rows_unchanged) == (12, 8, 2, 0)
    assert result.extra == {"dead_letters": 2}
    assert run.per_offset() == once((2, 10))
    assert run.per_offset("dead_letters") == once((10, 12))
    assert run.count() == 8 and run.ranges() == [(2, 12)]
    with ledger.tx() as conn:
        row = conn.execute(
            select(counter.messages).where(
                counter.messages.c.pipeline == run.pipeline, counter.messages.c.offset == 5
            )
        ).one()
        dead = conn.execute(
            select(s.dead_letters).where(s.dead_letters.c.pipeline == run.pipeline).order_by("offset")
        ).all()
    assert (row.key, row.value, row.value_bytes, row.version, row.instance_id) == (
        "5",
        "5",
        b"5",
        "v1",
        run.instance.id,
    )
    assert [(d.key, d.error.split(":")[0]) for d in dead] == [(b"-1", "ValueError"), (None, "ValueError")]


def test_a_replay_of_a_range_writes_nothing(ledger: Ledger, url: str) -> None:
    run = Run(ledger, url)
    run.write(list(range(6)))
    run.write([0, 1], partition=1)
    # The driver died before its ledger commit; the relaunched attempt replays the batch.
    run.attempt = run.new_attempt()
    run.sink.fence_epoch(run.pipeline, run.instance.id, run.attempt.epoch)
    again = run.write(list(range(6)))
    assert (again.rows_written, again.rows_unchanged) == (0, 6)
    assert run.per_offset() == {**once((0, 6)), **once((0, 2), partition=1)} and run.count() == 8
    assert run.ranges() == [(0, 6)] and run.ranges(1) == [(0, 2)]


def test_a_replay_split_differently_writes_only_the_new_offsets(ledger: Ledger, url: str) -> None:
    run = Run(ledger, url)
    run.write([0, 1, 3, 4, 9])  # a task that got these offsets only (another one holds 2, 5-8)
    assert run.ranges() == [(0, 2), (3, 5), (9, 10)]
    first = run.write(list(range(2, 7)))  # the replay, split otherwise: 2-6, then 7-11
    second = run.write(list(range(7, 12)))
    assert (first.rows_written, first.rows_unchanged) == (3, 2)
    assert (second.rows_written, second.rows_unchanged) == (4, 1)
    assert run.per_offset() == once((0, 12)) and run.count() == 12
    assert run.ranges() == [(0, 2), (2, 3), (3, 5), (5, 7), (7, 9), (9, 10), (10, 12)]
    poison = run.sink.write_task(run.ctx(), [record(12, key=b"x"), record(11)])
    again = run.sink.write_task(run.ctx(), [record(12, key=b"x"), record(13, key=b"x")])
    assert (poison.extra, again.extra, again.rows_unchanged) == ({"dead_letters": 1}, {"dead_letters": 1}, 1)
    assert run.per_offset("dead_letters") == once((12, 14))


def test_a_fenced_epoch_is_refused_and_writes_nothing(ledger: Ledger, url: str) -> None:
    run = Run(ledger, url)
    old = run.attempt
    run.write([0])
    newer = run.new_attempt()
    with pytest.raises(FencedWriteError, match=f"epoch {newer.epoch}"):
        run.write([1, 2], attempt=old)
    with pytest.raises(FencedWriteError):  # the old driver's restart of its fence is refused too
        run.sink.fence_epoch(run.pipeline, run.instance.id, old.epoch)
    run.sink.fence_epoch(run.pipeline, run.instance.id, newer.epoch)
    ledger.fence(run.instance.id, "test")  # the ledger fences the instance (stop, upgrade abort)
    with pytest.raises(FencedWriteError, match="FENCED"):
        run.write([1, 2], attempt=newer)
    assert run.per_offset() == once((0, 1)) and run.count() == 1 and run.ranges() == [(0, 1)]
    assert run.per_offset("dead_letters") == {}


def test_fence_instance_is_permanent(ledger: Ledger, url: str) -> None:
    run = Run(ledger, url)
    run.sink.fence_instance(run.pipeline, run.instance.id)  # live: marked FENCED in the ledger
    assert ledger.instance(run.instance.id).state is InstanceState.FENCED
    with pytest.raises(FencedWriteError):
        run.write([0])
    run.sink.fence_instance(run.pipeline, run.instance.id)  # idempotent
    with pytest.raises(FencedWriteError):
        run.sink.fence_instance("another", run.instance.id)
    assert run.per_offset() == {} and run.count() == 0


def test_a_url_that_is_no_ledger_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="RELAY_LEDGER_URL"):
        monkeypatch.delenv("RELAY_LEDGER_URL", raising=False)
        LedgerMessagesSink()
    with pytest.raises(ConfigError, match=r"\*\*\*"):
        LedgerMessagesSink("mysql://u:secret@h/db")
    monkeypatch.setenv("RELAY_LEDGER_URL", "postgresql+psycopg2://relay:s3cret@127.0.0.1:1/relay")
    assert "s3cret" not in repr(LedgerMessagesSink())
    with pytest.raises(Exception, match="no ledger"):
        LedgerMessagesSink(f"sqlite:///{tmp_path / 'none.db'}").prepare("p")
    assert not (tmp_path / "none.db").exists()


# ---- PostgreSQL: the fence waits for tasks in flight, overlapping tasks are serialised ---------------


def waiting(ledger: Ledger, like: str) -> int:
    with ledger.engine.connect() as conn:
        q = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q"
        return int(conn.execute(text(q), {"q": f"%{like}%"}).scalar_one())


@pytest.fixture()
def pg_run(postgres_ledger: str) -> Iterator[Run]:
    ledger = Ledger(postgres_ledger)
    yield Run(ledger, postgres_ledger)
    lm.dispose_engines()
    ledger.close()


def hold_partition(run: Run, partition: int = 0) -> Any:
    """A session holding the partition's advisory lock: a task of that partition waits inside its
    transaction, after its fence check (the instance row held FOR SHARE)."""
    conn = run.ledger.engine.connect()
    conn.begin()
    key = f"relay.message_ranges/{run.pipeline}/{T}"
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k), :p)"), {"k": key, "p": partition})
    return conn


@pytest.mark.integration
def test_a_new_attempt_waits_for_a_task_in_flight_then_no_old_task_commits(pg_run: Run) -> None:
    run = pg_run
    old = run.attempt
    blocker = hold_partition(run)
    task = Background(lambda: run.write([0, 1, 2], attempt=old))
    task.start()
    try:
        wait_for(
            "the task to wait inside its write", lambda: waiting(run.ledger, "pg_advisory_xact_lock"), 30
        )
        starting = Background(run.new_attempt)  # the relaunched driver: its token, then its epoch
        starting.start()
        wait_for("the new attempt to wait for the task", lambda: waiting(run.ledger, "instances"), 30)
        assert starting.is_alive()
    finally:
        blocker.rollback()
        blocker.close()
    task.join(30)
    starting.join(30)
    assert task.error is None and task.result.rows_written == 3, task.error  # in flight: it commits
    assert starting.error is None
    with pytest.raises(FencedWriteError):
        run.write([3], attempt=old)
    assert run.per_offset() == once((0, 3)) and run.count() == 3


@pytest.mark.integration
def test_overlapping_tasks_at_the_same_time_apply_each_offset_once(pg_run: Run) -> None:
    run = pg_run
    blocker = hold_partition(run)
    tasks = [
        Background(lambda: run.write(list(range(0, 8)))),
        Background(lambda: run.write(list(range(4, 12)))),
    ]
    try:
        for task in tasks:
            task.start()
        wait_for("both tasks to wait", lambda: waiting(run.ledger, "pg_advisory_xact_lock") == 2, 30)
    finally:
        blocker.rollback()
        blocker.close()
    for task in tasks:
        task.join(30)
        assert task.error is None, task.error
    assert sum(t.result.rows_written for t in tasks) == 12
    assert run.per_offset() == once((0, 12)) and run.count() == 12


def test_the_sink_creates_its_tables_and_the_ledger_has_none_of_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    create_ledger(url)
    ledger = Ledger(url)
    try:
        with ledger.tx() as conn:  # Relay's own tables only: the counter never ran here
            assert not counter.tables_exist(conn) and counter.message_count(conn, "p") is None
            assert counter.totals(conn, "p") == (0, 0) and not counter.has_ranges(conn, "p")
            ledger.ensure_pipeline("p", conn)
        sink = LedgerMessagesSink(url)
        sink.prepare("p")
        sink.prepare("p")  # a second driver (a relaunch, green) finds them there
        with ledger.tx() as conn:
            assert counter.tables_exist(conn) and counter.message_count(conn, "p") == 0
            assert conn.execute(select(func.count()).select_from(counter.message_ranges)).scalar() == 0
    finally:
        ledger.close()
