"""examples/foreach_batch_files' rule 5 by name: which directories a dead predecessor left that the
next owner's batch must delete before writing (the Spark side: tests/integration/test_standby_sinks.py)."""

from __future__ import annotations

import importlib.util

from relay.config import PROJECT_ROOT

_spec = importlib.util.spec_from_file_location(
    "fbf", PROJECT_ROOT / "examples" / "foreach_batch_files" / "pipeline.py"
)
assert _spec and _spec.loader
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)

T = "foreach_batch_files"  # a topic with "_" in it: the separator of a name's parts


def test_a_predecessors_directory_overlapping_this_batch_on_a_partition_it_held_goes() -> None:
    dead = ex.batch_dir_name({(T, 0): (100, 150), (T, 1): (40, 90)})  # written, never committed
    mine = {(T, 0): (100, 170), (T, 1): (40, 95)}  # the same cursors, planned to other ends
    assert ex.overlaps(dead, mine, {(T, 0): (1,), (T, 1): (1,)}) is True
    assert ex.overlaps(dead, mine, {(T, 1): (1,)}) is True


def test_committed_directories_and_other_partitions_stay() -> None:
    committed = ex.batch_dir_name({(T, 0): (50, 100), (T, 1): (0, 40)})  # ends where this batch starts
    mine = {(T, 0): (100, 170), (T, 1): (40, 95)}
    assert ex.overlaps(committed, mine, {(T, 0): (1,), (T, 1): (1,)}) is False
    other = ex.batch_dir_name({(T, 2): (100, 150)})
    assert ex.overlaps(other, mine, {(T, 0): (1,), (T, 1): (1,)}) is False
    # a partition without a predecessor is not judged: only what the dead instance held
    assert ex.overlaps(ex.batch_dir_name({(T, 0): (100, 150)}), mine, {(T, 1): (1,)}) is False
    # "foreach_batch_files.1" must not match inside "x_foreach_batch_files.1" of another topic
    assert ex.overlaps(ex.batch_dir_name({(f"x_{T}", 1): (40, 90)}), mine, {(T, 1): (1,)}) is False


def test_a_hashed_name_is_left_to_its_records() -> None:
    many = {(T, p): (0, 10_000_000) for p in range(12)}
    name = ex.batch_dir_name(many)
    assert name.startswith("ranges-sha256-") and ex.overlaps(name, many, {(T, 0): (1,)}) is None


def test_names_parse_back_to_their_ranges() -> None:
    ranges = {(T, 0): (5, 9), (f"x_{T}", 1): (40, 90), ("a.b", 12): (0, 3)}
    parsed = ex.parse_dir_name(ex.batch_dir_name(ranges))
    assert {(t, p): (a, b) for t, p, a, b in parsed} == ranges
