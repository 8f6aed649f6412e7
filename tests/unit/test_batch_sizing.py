"""Issue #31: batches sized from the lag and the measured cost when nobody fixed a size.

Behind, a batch grows (at most GROWTH times per batch) until it takes about the target, never past
the cap; caught up, it takes what arrived, and the size learned stays for the next burst. The cap
comes from the executors' memory; an operator's maxOffsetsPerTrigger turns the sizing off.
"""

from __future__ import annotations

import batch_sizing
import pytest
from batch_sizing import FIRST_ROWS, GROWTH, MIN_ROWS, BatchSizer, memory_cap_rows, parse_memory
from kafka_source_options import SourceSettings, session_batch_cap


def full_batch(sizer: BatchSizer, at: float, seconds: float) -> int:
    """Plan a batch that hits the limit at ``at``; the next plan comes ``seconds`` later."""
    rows = sizer.limit(at)
    sizer.planned(at, rows)
    return sizer.limit(at + seconds)


def test_a_cheap_full_batch_grows_the_next_by_at_most_growth() -> None:
    sizer = BatchSizer(cap=10_000_000)
    assert sizer.limit(0.0) == FIRST_ROWS
    assert full_batch(sizer, 0.0, 1.0) == int(FIRST_ROWS * GROWTH)  # 20k in 1 s wants 100k at 5 s
    assert "behind" in sizer.reason


def test_behind_the_size_settles_where_a_batch_takes_the_target() -> None:
    sizer, rate, at = BatchSizer(cap=10_000_000, target_s=5.0), 30_000.0, 0.0
    for _ in range(8):  # each batch takes a fixed 0.8 s plus rows / rate
        rows = sizer.limit(at)
        sizer.planned(at, rows)
        at += 0.8 + rows / rate
    took = 0.8 + sizer.limit(at) / rate
    assert 4.0 < took < 6.0


def test_never_past_the_cap_nor_below_the_floor() -> None:
    sizer = BatchSizer(cap=50_000)
    assert full_batch(sizer, 0.0, 0.1) == 50_000
    assert sizer.reason.endswith("(at the cap)")
    slow = BatchSizer(cap=10_000_000)
    assert full_batch(slow, 0.0, 3600.0) == MIN_ROWS  # a cold first batch must not starve the next
    tiny = BatchSizer(cap=10)
    assert tiny.limit(0.0) == 10 and full_batch(tiny, 0.0, 100.0) == 10


def test_caught_up_batches_say_nothing_about_speed_and_keep_the_size_learned() -> None:
    sizer = BatchSizer(cap=10_000_000)
    grown = full_batch(sizer, 0.0, 1.0)
    sizer.planned(1.0, 300)  # the lag was 300: the batch takes what arrived
    assert sizer.limit(60.0) == grown  # a minute idle is not a slow batch
    assert sizer.reason.startswith("caught up")
    sizer.planned(61.0, 0)  # no batch at all
    assert sizer.limit(62.0) == grown


@pytest.mark.parametrize(
    ("text", "size"),
    [("512m", 512 * 2**20), ("2g", 2 * 2**30), ("1024k", 2**20), ("4096", 4096), (" 1G ", 2**30)],
)
def test_spark_memory_strings(text: str, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["", "lots", "1.5g", "-1g", "12q"])
def test_bad_memory_strings_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_memory(text)


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
