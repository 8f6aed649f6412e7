"""The Kafka half of ``relay bench``'s latency section: its records, the hand-written transform
its baseline runs, and what the read_committed witness counts."""

from __future__ import annotations

import json

from relay_dev.bench.latency_kafka import output_id, purchase_output, purchase_record
from relay_dev.chaos.workloads import kept_event


def test_every_measured_record_is_a_purchase_the_example_keeps() -> None:
    for ident in (0, 1, 96, 97, 1_000_000_000, 1_000_059_999):
        key, value = purchase_record(ident, 123.0)
        assert kept_event(value) == ident  # the chaos witness's reading of the example's filter
        out_key, out_value = purchase_output(value)
        assert out_key == key
        body = json.loads(out_value)
        assert body["id"] == ident and body["user"] == key.decode()
        assert body["cents"] == round(json.loads(value)["amount"] * 100) > 0


def test_the_hand_written_transform_drops_what_the_example_drops() -> None:
    dropped = [
        b"not json",
        None,
        json.dumps([1, 2]).encode(),
        json.dumps({"id": 1, "kind": "view", "user": "u1", "amount": 3.0}).encode(),
        json.dumps({"id": 1, "kind": "purchase", "user": "u1", "amount": 0.0}).encode(),
        json.dumps({"id": 1, "kind": "purchase", "user": "u1", "amount": -2}).encode(),
        json.dumps({"kind": "purchase", "user": "u1", "amount": 2}).encode(),
    ]
    for value in dropped:
        assert purchase_output(value) is None, value
    key, value = purchase_output(
        json.dumps({"id": 7, "kind": "purchase", "user": "u3", "amount": 2.5}).encode()
    )
    assert key == b"u3" and json.loads(value) == {"id": 7, "user": "u3", "cents": 250}
    # Spark's round of amount * 100, read from a local session: 12.345 -> 1235, 0.125 -> 13 (half
    # up; Python's round gives 12), 0.285 -> 28 (the double is 28.499999999999996)
    for amount, cents in ((12.345, 1235), (0.125, 13), (0.285, 28)):
        _, out = purchase_output(
            json.dumps({"id": 8, "kind": "purchase", "user": "u", "amount": amount}).encode()
        )
        assert json.loads(out)["cents"] == cents, amount


def test_the_witness_counts_only_measured_ids() -> None:
    first = 1_000_000_000
    assert output_id(json.dumps({"id": first, "user": "u1", "cents": 5}).encode(), first) == first
    assert output_id(json.dumps({"id": 99, "user": "u1", "cents": 5}).encode(), first) is None  # warm-up
    assert output_id(b"\x00marker", first) is None
    assert output_id(json.dumps({"id": "x"}).encode(), first) is None
    assert output_id(json.dumps([first]).encode(), first) is None
