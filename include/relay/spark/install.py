"""Where the installed Spark distribution is (the pyspark wheel), for ``spark-submit`` and its jars."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from relay.errors import StackError


def spark_home() -> Path:
    """The installed pyspark folder (the pip wheel is a Spark distribution without sbin scripts)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise StackError("pyspark is not installed: cannot find a Spark distribution")
    return Path(spec.origin).parent
