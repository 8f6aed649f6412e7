"""A copy of one of ``examples/`` as the user's own package, with named lines changed."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from relay.errors import OperationError


def copy_example(example: Path, dest: Path, replacements: Iterable[tuple[str, str]]) -> Path:
    """``example`` copied to ``dest`` with each (old, new) replaced in its pipeline.py; an example
    that no longer holds an ``old`` text fails loudly (the bench would measure something else)."""
    shutil.copytree(example, dest, ignore=shutil.ignore_patterns("__pycache__"))
    code = dest / "pipeline.py"
    text = code.read_text()
    for old, new in replacements:
        if old not in text:
            raise OperationError(f"examples/{example.name} no longer has {old!r}")
        text = text.replace(old, new)
    code.write_text(text)
    return dest
