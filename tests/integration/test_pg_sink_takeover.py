"""Taking a range over from a dead instance, on the PostgreSQL upsert sink and a real PostgreSQL.

Instance A (id 1) died with a task still inside its write; instance B (id 2) continues A's range.
B's driver fences A through ``relay.sinks.base.take_over`` (this sink has no take-over of its own:
``fence_instance``), which waits for A's task in flight, after which no task of A commits. What A
committed past its ledger cursor B writes again, and newest-wins makes that a no-op.
Concurrency is driven by real locks and observed in pg_stat_activity, never by sleeping.
"""

from __future__ import annotations

import pytest
from relay.sinks.base import FencedWriteError, TaskResult, take_over

from tests.conftest import Background, wait_for
from tests.integration import test_pg_upsert_sink as base
from tests.integration.test_pg_upsert_sink import (
    TOPIC,
    connect,
    contents,
    ctx,
    lock_waiters,
    make_sink,
    row,
)

pytestmark = pytest.mark.integration
schema = base.schema  # the fixture: a schema of its own per test

A, B = 1, 2


def test_take_over_waits_for_the_predecessors_task_in_flight_then_fences_it(
    postgres_url: str, schema: str
) -> None:
    sink = make_sink(postgres_url, schema)
    sink.fence_epoch("pipe", A, 5)
    assert sink.write_task(ctx(5, instance=A), [row(1, 10)]).rows_written == 1  # ledger: cursor 11
    # A's next task stops INSIDE its write (fence row held FOR SHARE): another transaction holds key 2.
    blocker = connect(postgres_url)
    with blocker.cursor() as cur:
        cur.execute(
            f'INSERT INTO "{schema}".items (id, name, _relay_topic, _relay_partition, _relay_offset)'
            " VALUES (2, 'blocker', %s, 0, 0)",
            (TOPIC,),
        )
    zombie = Background(lambda: sink.write_task(ctx(5, instance=A), [row(2, 11), row(3, 12)]))
    zombie.start()
    fence = None
    try:
        wait_for("A's task to wait inside its write", lambda: lock_waiters(postgres_url, '"items"'), 30)
        sink.fence_epoch("pipe", B, 1)  # B's driver starts, then takes A's range over
        fence = Background(lambda: take_over(sink, "pipe", B, 1, {(TOPIC, 0): (A,)}))
        fence.start()
        wait_for(
            "the take-over to wait for A's task",
            lambda: lock_waiters(postgres_url, "FOR UPDATE") or not fence.is_alive(),
            30,
        )
        assert fence.is_alive(), f"the take-over did not wait for A's task: {fence.error!r}"
    finally:
        blocker.rollback()
        blocker.close()
    zombie.join(30)
    assert fence is not None
    fence.join(30)
    assert not zombie.is_alive() and not fence.is_alive() and fence.error is None
    # A's task was in flight before the fence: it committed before the take-over returned.
    assert zombie.error is None and isinstance(zombie.result, TaskResult) and zombie.result.rows_written == 2
    # From now on no task of A commits, whatever its epoch; B's write of A's tail is a no-op.
    with pytest.raises(FencedWriteError, match="fenced"):
        sink.write_task(ctx(5, instance=A), [row(4, 13)])
    b = sink.write_task(ctx(1, instance=B), [row(2, 11), row(3, 12), row(4, 13)])
    assert (b.rows_written, b.rows_unchanged) == (1, 2)
    assert contents(postgres_url, schema) == {
        1: ("n1@0:10", 0, 10),
        2: ("n2@0:11", 0, 11),
        3: ("n3@0:12", 0, 12),
        4: ("n4@0:13", 0, 13),
    }
    take_over(sink, "pipe", B, 1, {(TOPIC, 0): (A,)})  # idempotent: a restarted driver does it again
    with connect(postgres_url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT instance_id, fenced FROM "{schema}".relay_sink_fences ORDER BY 1')
        assert cur.fetchall() == [(A, True), (B, False)]
