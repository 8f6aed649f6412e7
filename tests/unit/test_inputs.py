"""The shared input rules (relay.config.inputs): version labels, times, offsets, counters, CLI number types.

The DAG params use the same patterns (tests/unit/test_dag_params.py); here each rule is checked on
its own, with the inputs an operator could plausibly type by mistake.
"""

from __future__ import annotations

import argparse
import re

import pytest
from relay.artifacts import validate_version as artifacts_validate_version
from relay.cli.args import float_above, int_at_least
from relay.config.inputs import (
    HANDOFF_PATTERN,
    OPTIONAL_VERSION_PATTERN,
    TIME_PATTERN,
    VERSION_PATTERN,
    parse_partition_offsets,
    parse_time_ms,
    recover_inputs,
    validate_version,
)
from relay.errors import ConfigError
from relay.kafka.counter_key import COUNTER_MAX, parse_counter_bytes

BAD_VERSIONS = [
    ".",
    "..",
    "../x",
    "a/b",
    "v1/../x",
    "a..b",
    "-v1",
    "_v1",
    "v1\n",
    "v 1",
    "v1;rm",
    "v" * 65,
    "",
]


def test_artifacts_uses_the_shared_version_rule() -> None:
    assert artifacts_validate_version is validate_version


@pytest.mark.parametrize("version", ["v1", "V2", "1.2.3", "v2-rc_1", "v" * 64])
def test_good_versions_pass_the_python_rule_and_both_patterns(version: str) -> None:
    assert validate_version(version) == version
    assert re.search(VERSION_PATTERN, version) and re.search(OPTIONAL_VERSION_PATTERN, version)


@pytest.mark.parametrize("version", BAD_VERSIONS)
def test_bad_versions_are_refused_by_the_python_rule_and_the_pattern(version: str) -> None:
    with pytest.raises(ConfigError, match="version must be"):
        validate_version(version)
    assert not re.search(VERSION_PATTERN, version)


def test_only_the_optional_pattern_accepts_empty() -> None:
    assert re.search(OPTIONAL_VERSION_PATTERN, "") and not re.search(VERSION_PATTERN, "")
    assert not re.search(OPTIONAL_VERSION_PATTERN, "\n")


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1700000000000", 1_700_000_000_000),
        ("2024-05-01", 1_714_521_600_000),
        ("2024-05-01T12:00:00Z", 1_714_564_800_000),
        ("2024-05-01 12:00", 1_714_564_800_000),  # no zone: UTC
        ("2024-05-01T14:00:00+02:00", 1_714_564_800_000),
        ("2024-05-01T12:00:00.250+0000", 1_714_564_800_250),
    ],
)
def test_times_in_epoch_ms_or_iso_8601(text: str, ms: int) -> None:
    assert re.search(TIME_PATTERN, text)
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "-1",
        "1.5",
        "0042",
        "2024-13-01",
        "2024-05-01T25:00",
        "1700000000000\n",
        "٤٢",
        "12345678901234567",
    ],
)
def test_bad_times_are_refused_by_pattern_and_parser(text: str) -> None:
    assert not re.search(TIME_PATTERN, text)
    with pytest.raises(ConfigError, match="time must be"):
        parse_time_ms(text)


def test_a_date_the_pattern_cannot_judge_is_refused_by_the_parser() -> None:
    assert re.search(TIME_PATTERN, "2024-02-30")
    with pytest.raises(ConfigError, match="not a valid date"):
        parse_time_ms("2024-02-30")


def test_offsets_from_json_text_or_object() -> None:
    assert parse_partition_offsets('{"0": 42, "1": 7}') == {0: 42, 1: 7}
    assert parse_partition_offsets({"2": 0}) == {2: 0}
    assert parse_partition_offsets("") is None and parse_partition_offsets({}) is None
    assert parse_partition_offsets(None) is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ('{"0": -1}', "less than the minimum"),
        ('{"-1": 5}', "partitions must be non-negative integers"),
        ('{"x": 5}', "partitions must be non-negative integers"),
        ('{"01": 5}', "partitions must be non-negative integers"),
        ('{"0": "5"}', "not of type 'integer'"),
        ('{"0": 1.5}', "not of type 'integer'"),
        ('{"0": true}', "not of type 'integer'"),
        ('{"0": 9223372036854775808}', "greater than the maximum"),
        ('{"0": 1, "0": 2}', "more than once"),
        ("[1, 2]", "not of type 'object'"),
        ("not json", "JSON object"),
        ({"0": -3}, "less than the minimum"),
    ],
)
def test_bad_offsets_are_refused_with_the_reason(value: object, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_partition_offsets(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("strategy", "time", "offsets", "expected"),
    [
        ("earliest", "", "", (None, None)),
        ("latest", None, None, (None, None)),
        ("timestamp", "1700000000000", {}, (1_700_000_000_000, None)),
        ("offsets", "", {"0": 42}, (None, {0: 42})),
        ("offsets", "", '{"1": 7}', (None, {1: 7})),
    ],
)
def test_recover_inputs_that_agree(strategy: str, time: str, offsets: object, expected: tuple) -> None:
    checked = recover_inputs(strategy, time, offsets)  # type: ignore[arg-type]
    assert (checked.strategy, checked.timestamp_ms, checked.offsets) == (strategy, *expected)


@pytest.mark.parametrize(
    ("strategy", "time", "offsets", "why"),
    [
        ("timestamp", "", {}, "strategy timestamp needs a time"),
        ("offsets", "", {}, "strategy offsets needs offsets"),
        ("earliest", "2024-05-01", {}, "a time was given but strategy is earliest"),
        ("latest", "", {"0": 1}, "offsets were given but strategy is latest"),
        ("sideways", "", {}, "strategy must be one of"),
        ("timestamp", "soon", {}, "time must be"),
    ],
)
def test_recover_inputs_that_disagree_are_refused_in_one_line(
    strategy: str, time: str, offsets: object, why: str
) -> None:
    with pytest.raises(ConfigError, match=why) as caught:
        recover_inputs(strategy, time, offsets)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "handoff", ["latest", '{"experience": {"0": 42}}', ' {"t-1": {"0": 1, "2": 3}} ', '{"a.b_c": {"10": 0}}']
)
def test_good_handoffs(handoff: str) -> None:
    assert re.search(HANDOFF_PATTERN, handoff)


@pytest.mark.parametrize(
    "handoff", ["", "Latest", "latest\n", "now", '{"t": {}}', '{"t": {"0": -1}}', '{"t": {"a": 1}}', "{}"]
)
def test_bad_handoffs(handoff: str) -> None:
    assert not re.search(HANDOFF_PATTERN, handoff)


@pytest.mark.parametrize(("raw", "n"), [(b"0", 0), (b"42", 42), (str(COUNTER_MAX).encode(), COUNTER_MAX)])
def test_canonical_counters(raw: bytes, n: int) -> None:
    assert parse_counter_bytes(raw) == n


@pytest.mark.parametrize(
    "raw",
    [
        b" 42 ",
        b"43\n",
        b"+7",
        b"4_4",
        "٤٤".encode(),  # Arabic-Indic digits
        "４２".encode(),  # fullwidth digits
        b"-0",
        b"-1",
        b"007",
        b"",
        b"1e3",
        b"\xff\xfe",
        str(COUNTER_MAX + 1).encode(),
        b"9" * 50,
        None,
    ],
)
def test_everything_else_is_not_a_counter(raw: bytes | None) -> None:
    with pytest.raises(ValueError):
        parse_counter_bytes(raw)


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("5", 5), ("1000000", 1_000_000)])
def test_int_at_least_accepts_plain_integers(text: str, value: int) -> None:
    assert int_at_least(0)(text) == value


@pytest.mark.parametrize("text", ["-5", "-0.5", "1e3", "+5", " 5", "5_000", "٥", "five", ""])
def test_int_at_least_refuses_with_one_clear_message(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer >= 0, got"):
        int_at_least(0)(text)


@pytest.mark.parametrize(("text", "value"), [("0.5", 0.5), ("10", 10.0), ("1e3", 1000.0), (".25", 0.25)])
def test_float_above_accepts_finite_positive_numbers(text: str, value: float) -> None:
    assert float_above(0)(text) == value


@pytest.mark.parametrize("text", ["0", "0.0", "-1", "nan", "inf", "-inf", "1e999", "fast", "", " 1"])
def test_float_above_refuses_zero_negative_and_non_finite(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a number > 0, got"):
        float_above(0)(text)
