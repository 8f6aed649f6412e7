"""The rules operator input is checked against, defined once for the DAG params, the CLI and the library.

The CLI's argparse types built on these rules are in ``relay.cli.args``; the counter's key format in
``relay.kafka.counter_key``.

Why one module: a DAG param is validated by Airflow when the run is triggered (the REST API answers
400, the UI form refuses), before any task runs, and JSON schema is the only language Airflow
applies there. The same patterns are used by the Python checks (``validate_version``, the CLI's
argument types, the recovery's arguments), so what a trigger accepts and what the code accepts
cannot drift apart. This module imports nothing heavy: every DAG file imports it at parse time.

Patterns end with ``END`` instead of a bare ``$``: jsonschema runs Python's ``re.search``, where
``$`` also matches before a final newline (``"v1\\n"`` passed ``^v[0-9]+$``); the lookahead refuses
it, and in ECMAScript (the UI's validator) it is a no-op. Digits are ``[0-9]``, never ``\\d``,
which in Python matches every Unicode digit (Arabic-Indic ``٤٢`` included).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from relay.errors import ConfigError

END = r"$(?!\n)"

# A version label names a folder (``<data_dir>/artifacts/<version>``) and a Spark app: it starts with
# a letter or digit (so never ``.``, ``..`` nor ``-x``), holds no ``/`` and no ``..`` anywhere.
_VERSION = r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
VERSION_PATTERN = rf"^{_VERSION}{END}"
#: relay_deploy: empty means "the version the pipeline ran last".
OPTIONAL_VERSION_PATTERN = rf"^(?:{_VERSION})?{END}"
VERSION_MAX_LENGTH = 64

_EPOCH_MS = r"(?:0|[1-9][0-9]{0,15})"
_ISO_8601 = (
    r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    r"(?:[T ](?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{1,6})?)?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):?[0-5][0-9])?)?"
)
#: relay_recover ``time``: empty (not given), epoch milliseconds, or an ISO 8601 date or date-time.
TIME_PATTERN = rf"^(?:{_EPOCH_MS}|{_ISO_8601})?{END}"

MAX_OFFSET = 2**63 - 1  # Kafka offsets are int64
_PARTITION = r"(?:0|[1-9][0-9]{0,8})"  # below 10^9 (Kafka partitions are int32)
PARTITION_KEY_PATTERN = rf"^{_PARTITION}{END}"
#: relay_recover ``offsets``: partition (a JSON key, so a string) -> offset. Empty: not given.
OFFSETS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "patternProperties": {
        PARTITION_KEY_PATTERN: {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
    },
    "additionalProperties": False,
    "maxProperties": 100_000,
}

_TOPIC = r"[A-Za-z0-9._-]{1,249}"
_OFFSET = r"(?:0|[1-9][0-9]{0,18})"
_JSON_OFFSETS = rf'\{{\s*"{_PARTITION}"\s*:\s*{_OFFSET}(?:\s*,\s*"{_PARTITION}"\s*:\s*{_OFFSET})*\s*\}}'
#: relay_upgrade ``handoff``: ``latest`` or JSON ``{"<topic>": {"0": 42}}`` (at least one partition).
HANDOFF_PATTERN = rf'^(?:latest|\s*\{{\s*"{_TOPIC}"\s*:\s*{_JSON_OFFSETS}\s*\}}\s*){END}'

STRATEGIES = ("earliest", "latest", "timestamp", "offsets")


def short_repr(value: object, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: one readable line whatever the operator typed."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_version(version: str) -> str:
    """``version`` when it is a valid label (``VERSION_PATTERN``); ConfigError otherwise."""
    if not isinstance(version, str) or not re.search(VERSION_PATTERN, version):
        raise ConfigError(
            "version must be 1-64 letters, digits, '.', '_' or '-', start with a letter or digit and "
            f"contain no '..', got {short_repr(version)}"
        )
    return version


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, from epoch ms or ISO 8601 (UTC when no zone is given)."""
    if not isinstance(text, str) or not text or not re.search(TIME_PATTERN, text):
        raise ConfigError(
            f"time must be epoch milliseconds or ISO 8601 (2024-05-01T12:00:00Z), got {short_repr(text)}"
        )
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:  # the pattern cannot tell that February has no 30th
        raise ConfigError(f"time {short_repr(text)} is not a valid date: {exc}") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ConfigError(f"offsets name partition(s) {dupes} more than once")
    return dict(pairs)


def parse_partition_offsets(value: str | Mapping[str, Any] | None) -> dict[int, int] | None:
    """``{partition: offset}`` from JSON text (CLI) or an object (DAG param); None when empty.

    Checked against ``OFFSETS_SCHEMA``, the schema the DAG param uses, so both refuse the same input.
    """
    from jsonschema import ValidationError, validate

    if value is None or value == "" or value == {}:
        return None
    example = 'offsets must be a JSON object of partition -> offset, e.g. {"0": 42, "1": 7}'
    data: Any = value
    if isinstance(value, str):
        try:
            data = json.loads(value, object_pairs_hook=_no_duplicate_keys)
        except ValueError as exc:
            raise ConfigError(f"{example}; got {short_repr(value)}") from exc
    try:
        validate(data, OFFSETS_SCHEMA)
    except ValidationError as exc:
        if exc.validator == "additionalProperties":  # jsonschema would quote the whole regex
            bad = sorted(str(k) for k in data if not re.search(PARTITION_KEY_PATTERN, str(k)))
            raise ConfigError(f"{example}; partitions must be non-negative integers, got {bad}") from exc
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ConfigError(f"{example}; {where + ': ' if where else ''}{exc.message}") from exc
    return {int(p): int(o) for p, o in data.items()}


@dataclass(frozen=True)
class RecoverInputs:
    """The recovery's arguments after the cross-field rules a per-param schema cannot express."""

    strategy: str
    timestamp_ms: int | None
    offsets: dict[int, int] | None


def recover_inputs(strategy: str, time: str | None, offsets: str | Mapping[str, Any] | None) -> RecoverInputs:
    """Check strategy, time and offsets together; ConfigError (one line) before anything is touched.

    A time or offsets given with another strategy is refused rather than ignored: the operator most
    likely forgot to set the strategy, and a recovery that silently does something else is worse.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {short_repr(strategy)}")
    timestamp_ms = parse_time_ms(time) if time else None
    parsed = parse_partition_offsets(offsets)
    if strategy == "timestamp" and timestamp_ms is None:
        raise ConfigError("strategy timestamp needs a time (epoch milliseconds or ISO 8601)")
    if strategy == "offsets" and not parsed:
        raise ConfigError('strategy offsets needs offsets, e.g. {"0": 42, "1": 7}')
    if timestamp_ms is not None and strategy != "timestamp":
        raise ConfigError(
            f"a time was given but strategy is {strategy}: set strategy timestamp or clear time"
        )
    if parsed and strategy != "offsets":
        raise ConfigError(
            f"offsets were given but strategy is {strategy}: set strategy offsets or clear offsets"
        )
    return RecoverInputs(strategy, timestamp_ms, parsed)
