"""The CLI's argument types: each refuses in one line what the DAG params refuse (``relay.config.inputs``).

Why apart from the rules: argparse is the CLI's concern; the DAGs import the rules at parse time.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NoReturn

from relay.config.bounds import MAX_RECORDS, MAX_SECONDS
from relay.config.inputs import HANDOFF_PATTERN, short_repr, validate_version
from relay.errors import ConfigError


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with a one-line error: ``relay produce: argument --count: must be ... (see --help)``.

    Why: the default prints the whole usage block before the error, which buries the one line an
    operator (or a script reading stderr) needs. Subparsers inherit the class.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def int_at_least(minimum: int, maximum: int = MAX_RECORDS) -> Callable[[str], int]:
    """argparse type: a plain decimal integer in [``minimum``, ``maximum``] (no ``+``, ``_``,
    spaces or ``1e3``; ``maximum`` by default the most records one command sends)."""

    def parse(text: str) -> int:
        if not _INT.fullmatch(text) or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {short_repr(text)}")
        if len(text) > 20 or int(text) > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {short_repr(text)}")
        return int(text)

    parse.__name__ = f"integer >= {minimum}"
    return parse


def float_above(minimum: float, maximum: float = MAX_SECONDS) -> Callable[[str], float]:
    """argparse type: a finite decimal number in (``minimum``, ``maximum``] (``nan``, ``inf`` and
    ``0`` for rates refused; ``maximum`` by default a week of seconds)."""

    def parse(text: str) -> float:
        value = float(text) if _FLOAT.fullmatch(text) else math.nan
        if not math.isfinite(value) or value <= minimum:
            raise argparse.ArgumentTypeError(f"must be a number > {minimum:g}, got {short_repr(text)}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {short_repr(text)}")
        return value

    parse.__name__ = f"number > {minimum:g}"
    return parse


def version_arg(text: str) -> str:
    """argparse type: a version label (``VERSION_PATTERN``)."""
    try:
        return validate_version(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def handoff_arg(text: str) -> str:
    """argparse type: ``latest`` or JSON ``{"<topic>": {"0": 42}}`` (``HANDOFF_PATTERN``, as the DAG)."""
    if not re.search(HANDOFF_PATTERN, text):
        raise argparse.ArgumentTypeError(
            'must be "latest" or JSON like {"<topic>": {"0": 42}} with offsets >= 0, '
            f"got {short_repr(text)}"
        )
    return text
