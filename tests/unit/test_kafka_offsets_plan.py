"""Offset planning of the relaykafka source without a broker or Spark: every batch stays bounded.

The end-to-end proof is tests/integration/test_kafka_source.py (real Spark, real broker); these pin
the arithmetic, including the cases a live run rarely reaches.
"""

from __future__ import annotations

import random

import pytest
from kafka_offsets_plan import batch_row_limit, plan_batch_end, rate_limit
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from relay.errors import DataLossError

T = "t"


def _tp(offsets: dict[int, int]) -> dict[tuple[str, int], int]:
    return {(T, p): o for p, o in offsets.items()}


@pytest.mark.parametrize(
    ("spark_limit", "option", "expected"),
    [
        (ReadAllAvailable(), 2000, 2000),  # Trigger.Once: Spark drops the limit, the option holds
        (ReadMaxRows(5000), 2000, 2000),
        (ReadMaxRows(500), 2000, 500),
        (ReadMaxRows(300), None, 300),
        (ReadAllAvailable(), None, None),  # no limit anywhere: read all
    ],
)
def test_the_batch_limit_is_the_smaller_of_spark_and_the_option(
    spark_limit: object, option: int | None, expected: int | None
) -> None:
    assert batch_row_limit(spark_limit, option) == expected  # type: ignore[arg-type]


def test_an_outage_backlog_is_planned_in_bounded_batches_whatever_spark_passes() -> None:
    start = _tp({0: 1000, 1: 1000, 2: 1000})
    latest = _tp({0: 9000, 1: 12000, 2: 7000})
    end = plan_batch_end(
        start,
        _tp({0: 0, 1: 0, 2: 0}),
        latest,
        fail_on_data_loss=True,
        max_rows=batch_row_limit(ReadAllAvailable(), 2000),
    )
    assert sum(end[tp] - start[tp] for tp in start) <= 2000
    assert all(start[tp] < end[tp] <= latest[tp] for tp in start), "every partition moves"


def test_a_limit_below_the_partition_count_is_still_respected() -> None:
    start = _tp(dict.fromkeys(range(5), 0))
    until = _tp({0: 100, 1: 50, 2: 5, 3: 1, 4: 300})
    end = rate_limit(start, until, 2)
    assert sum(end[tp] - start[tp] for tp in start) == 2
    assert end[(T, 4)] == 1 and end[(T, 0)] == 1, "the largest backlogs go first"


def test_rate_limit_never_exceeds_the_limit_nor_the_backlog() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 12)
        start = _tp({p: rng.randint(0, 1000) for p in range(n)})
        until = {tp: o + rng.choice([0, 0, 1, rng.randint(0, 50_000)]) for tp, o in start.items()}
        limit = rng.randint(1, 30_000)
        end = rate_limit(start, until, limit)
        assert sum(end[tp] - start[tp] for tp in start) <= limit, (start, until, limit)
        assert all(start[tp] <= end[tp] <= until[tp] for tp in start), (start, until, limit)
        if sum(until[tp] - start[tp] for tp in start) <= limit:
            assert end == until


def test_caps_apply_before_the_limit_and_a_new_partition_enters_without_rows() -> None:
    def plan(max_rows: int | None) -> dict[tuple[str, int], int]:
        return plan_batch_end(
            _tp({0: 0, 1: 0}),
            _tp({0: 0, 1: 0, 2: 40}),
            _tp({0: 1000, 1: 1000, 2: 900}),
            fail_on_data_loss=True,
            caps={T: {0: 100}},
            max_rows=max_rows,
        )

    assert plan(None) == _tp({0: 100, 1: 1000, 2: 40}), "capped at the lease's end; 2 is new: no rows"
    assert plan(300) == _tp({0: 27, 1: 272, 2: 40}), "the limit splits the capped backlog"


def test_a_start_below_the_earliest_offset_is_data_loss() -> None:
    with pytest.raises(DataLossError, match="needed offset 5, earliest available is 50"):
        plan_batch_end(_tp({0: 5}), _tp({0: 50}), _tp({0: 60}), fail_on_data_loss=True, max_rows=10)


def test_a_warm_standby_starts_reading_at_its_lease_floor_not_at_sparks_position() -> None:
    """Green's query sat at earliest (0, records long deleted) while it held; its lease starts at H."""
    floors = {T: {0: 5_000, 1: 7_000}}
    end = plan_batch_end(
        _tp({0: 0, 1: 0}),
        _tp({0: 1_000, 1: 1_000}),  # retention deleted below 1,000: not green's offsets, no data loss
        _tp({0: 5_400, 1: 7_100}),
        fail_on_data_loss=True,
        max_rows=300,
        floors=floors,
    )
    assert end == _tp({0: 5_240, 1: 7_060}), "the row limit counts from the floor, split by backlog"
    assert plan_batch_end(
        _tp({0: 5_400}), _tp({0: 0}), _tp({0: 5_500}), fail_on_data_loss=True, floors={T: {0: 100}}
    ) == _tp({0: 5_500}), "a floor below Spark's position changes nothing"
