"""The warm standby's rehearsal batch: what it reads and that it can never read under a lease guard.

The end-to-end proof (green's rehearsal hands the tail blue applied to the real sink, which writes
none of it) is in tests/integration/test_counter_pipeline.py.
"""

from __future__ import annotations

import json

from warm_up_batch import GUARD_OPTIONS, rehearsal_options, rehearse, tail_offsets


def test_the_tail_is_the_last_records_of_each_partition_never_below_earliest() -> None:
    earliest = {0: 0, 1: 95, 2: 7}
    latest = {0: 1000, 1: 100, 2: 7}
    assert tail_offsets(earliest, latest, 20) == {0: 980, 1: 95, 2: 7}


def test_rehearsal_reads_from_the_tail_without_the_ledger_guard() -> None:
    source = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "subscribe": "orders",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "20000",
        "failOnDataLoss": "true",
        "relay.ledgerUrlEnv": "RELAY_LEDGER_URL",
        "relay.instanceId": "7",
    }
    options = rehearsal_options(source, "orders", {1: 95, 0: 980})
    assert not set(GUARD_OPTIONS) & set(options)  # no lease guard: it must not plan on the row
    assert json.loads(options["startingOffsets"]) == {"orders": {"0": 980, "1": 95}}
    assert options["maxOffsetsPerTrigger"] == "20000" and options["subscribe"] == "orders"
    assert source["relay.instanceId"] == "7"  # the driver's own options are left as they were


class _Unreachable:
    """A session whose every use fails: the rehearsal must give up quietly (a standby goes on)."""

    def __getattr__(self, name: str) -> object:
        raise RuntimeError("no Spark here")


def test_a_failed_rehearsal_is_skipped_not_raised(tmp_path) -> None:  # noqa: ANN001
    source = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "orders"}
    calls: list[object] = []
    seen = rehearse(_Unreachable(), source, "orders", calls.append, tmp_path, timeout_s=1)
    assert seen == 0 and calls == []
    assert list(tmp_path.iterdir()) == []  # no checkpoint left behind
