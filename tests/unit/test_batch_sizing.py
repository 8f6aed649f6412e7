"""Issue #31: batches sized from the lag and the measured cost when nobody fixed a size.

Behind, a batch takes the cap (from the executors' memory); a pipeline so slow per row that such a
batch takes over twice the target shrinks to aim at the target (never on the first, cold, batch),
and grows back (at most GROWTH times per batch) as it speeds up. Caught up, a batch takes what
arrived and says nothing about speed. An operator's maxOffsetsPerTrigger turns the sizing off.
"""

from __future__ import annotations

import batch_sizing
import pytest
from batch_sizing import GROWTH, MIN_ROWS, BatchSizer, memory_cap_rows
from kafka_source_options import SourceSettings, session_batch_cap

CAP = 200_000


def full_batch(sizer: BatchSizer, at: float, seconds: float) -> int:
    """Plan a batch that hits the limit at ``at``; the next plan comes ``seconds`` later."""
    rows = sizer.limit(at)
    sizer.planned(at, rows)
    return sizer.limit(at + seconds)


def test_behind_a_batch_takes_the_cap_while_it_is_fast_enough() -> None:
    sizer = BatchSizer(cap=CAP, target_s=5.0)
    assert sizer.limit(0.0) == CAP
    assert full_batch(sizer, 0.0, 8.0) == CAP  # 8 s: within twice the target
    assert full_batch(sizer, 10.0, 1.0) == CAP  # faster: still the cap, never past it


def test_the_cold_first_batch_never_shrinks_the_size() -> None:
    sizer = BatchSizer(cap=CAP, target_s=5.0)
    assert full_batch(sizer, 0.0, 60.0) == CAP  # the Python workers' start, the JIT
    assert full_batch(sizer, 60.0, 60.0) == int(CAP / 60.0 * 5.0)  # the second slow one does
    assert "aiming at 5 s" in sizer.reason


def test_a_slow_pipeline_settles_where_a_batch_takes_the_target_and_grows_back() -> None:
    sizer, at = BatchSizer(cap=10_000_000, target_s=5.0), 0.0
    for _ in range(10):  # each batch takes a fixed 0.8 s plus rows / 20,000 rows a second
        rows = sizer.limit(at)
        sizer.planned(at, rows)
        at += 0.8 + rows / 20_000.0
    took = 0.8 + sizer.limit(at) / 20_000.0
    assert took <= 2 * 5.0 and sizer.rows < 10_000_000
    before = sizer.rows
    assert full_batch(sizer, at, 0.5) == int(GROWTH * before)  # the sink got faster: grow, by GROWTH


def test_never_below_the_floor_nor_past_a_tiny_cap() -> None:
    slow = BatchSizer(cap=CAP)
    full_batch(slow, 0.0, 3600.0)
    assert full_batch(slow, 3600.0, 3600.0) == MIN_ROWS
    tiny = BatchSizer(cap=10)
    assert tiny.limit(0.0) == 10 and full_batch(tiny, 0.0, 100.0) == 10 and full_batch(tiny, 1, 100) == 10


def test_caught_up_batches_say_nothing_about_speed() -> None:
    sizer = BatchSizer(cap=CAP)
    full_batch(sizer, 0.0, 1.0)
    sizer.planned(1.0, 300)  # the lag was 300: the batch takes what arrived
    assert sizer.limit(600.0) == CAP  # ten minutes idle is not a slow batch
    sizer.planned(601.0, 0)  # no batch at all
    assert sizer.limit(900.0) == CAP and sizer.measured == 1


def test_the_cap_follows_the_executors_memory() -> None:
    one = memory_cap_rows("512m")
    assert one == int(512 * 2**20 * batch_sizing.MEMORY_SHARE / batch_sizing.ROW_BYTES)
    assert memory_cap_rows("512m", executors=2) == 2 * one
    assert memory_cap_rows("1m") == MIN_ROWS
    assert memory_cap_rows("1024g") == batch_sizing.MAX_MEMORY_ROWS


def test_the_session_gives_the_cap_local_mode_from_the_driver() -> None:
    conf = {"spark.executor.memory": "1g", "spark.cores.max": "4", "spark.executor.cores": "2"}
    assert session_batch_cap(conf, "spark://h:7077") == memory_cap_rows("1g", 2)
    assert session_batch_cap({}, "spark://h:7077") == memory_cap_rows("1g")
    assert session_batch_cap({"spark.driver.memory": "2g"}, "local[2]") == memory_cap_rows("2g")


def test_the_source_sizes_only_when_no_size_is_fixed() -> None:
    import kafka_source

    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    adaptive = kafka_source.KafkaStreamReader(SourceSettings.from_options(base, None, 123_456))
    assert adaptive._sizer is not None and adaptive._sizer.cap == 123_456
    fixed = SourceSettings.from_options({**base, "maxOffsetsPerTrigger": "500"}, None, 123_456)
    assert kafka_source.KafkaStreamReader(fixed)._sizer is None
    own = SourceSettings.from_options({**base, "relay.batchCapRows": "9000"}, None, 123_456)
    assert own.batch_cap_rows == 9000


def test_bad_targets_and_caps_are_refused() -> None:
    with pytest.raises(ValueError):
        BatchSizer(cap=0)
    with pytest.raises(ValueError):
        BatchSizer(cap=10, target_s=float("nan"))
