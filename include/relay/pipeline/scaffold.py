"""``relay new pipeline NAME``: a pipeline package to start from, declared in the pipelines file.

What a user would otherwise copy by hand from ``examples/kafka_to_kafka``: a transform (JSON events
in, reshaped JSON out), the Kafka transactional sink (exactly once for a ``read_committed``
consumer), a unit test of the transform on a local Spark session and a README. It is written only
against the public contract and deploys on the embedded stack as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from relay.errors import ConfigError
from relay.pipeline.pipelines_file import TOPIC, read_pipelines_file

PACKAGE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")  # a Python package, a Spark app name, a TOML key

PIPELINE_PY = '''"""{name}: JSON events from Kafka topic {topic!r}, reshaped, written once to {output!r}.

Written against Relay's public contract (``relay.pipeline``). Input values look like
``{{"id": 7, "amount": 12.5}}``; the transform keeps events with a positive amount and writes
``{{"id", "cents"}}`` keyed by id. Each source partition's rows go out in one Kafka transaction with
a marker of the source range: a replay after a crash writes nothing twice. Change ``transform`` (and
its test, ``test_pipeline.py``) to your own logic; keep ``topic``, ``partition`` and ``offset``.
"""

from __future__ import annotations

import os

from relay.pipeline import Pipeline
from relay.sinks.kafka_transactional import KafkaTransactionalSink

NAME = "{name}"
TOPIC = "{topic}"
OUTPUT_TOPIC = "{output}"
BOOTSTRAP_ENV = "{env}"  # the output cluster, host:port[,host:port]
VALUE_SCHEMA = "id BIGINT, amount DOUBLE"


def transform(df):  # noqa: ANN001, ANN201 - pyspark DataFrames (imported on the executors)
    """Parse the JSON value, keep positive amounts, reshape to ``key`` and a JSON ``value``."""
    from pyspark.sql import functions as F

    v = F.from_json(F.col("value").cast("string"), VALUE_SCHEMA).alias("v")
    events = df.select("topic", "partition", "offset", v)
    kept = events.where(F.col("v.id").isNotNull() & (F.col("v.amount") > 0))
    body = F.struct(F.col("v.id").alias("id"), F.round(F.col("v.amount") * 100).cast("long").alias("cents"))
    return kept.select(
        "topic",
        "partition",
        "offset",
        F.col("v.id").cast("string").alias("key"),
        F.to_json(body).alias("value"),
    )


def sink() -> KafkaTransactionalSink:
    """Built on the driver at start, where Relay put the variable (not when ``relay build`` imports)."""
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        raise KeyError(f"{{BOOTSTRAP_ENV}} is not set")
    out = KafkaTransactionalSink(bootstrap, OUTPUT_TOPIC, key_column="key", value_column="value")
    out.create_topic(3)  # a scratch topic when missing; in production, create yours (partitions, replication)
    return out


PIPELINE = Pipeline(name=NAME, topics=(TOPIC,), transform=transform, sink=sink, secret_env=(BOOTSTRAP_ENV,))
'''

TEST_PY = '''"""The transform of {name} on a local Spark session: what each input record becomes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline import transform  # noqa: E402 - the package folder is not installed


@pytest.fixture(scope="module")
def spark():  # noqa: ANN201
    from pyspark.sql import SparkSession

    session = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    yield session
    session.stop()


def test_positive_amounts_become_cents_and_the_rest_is_dropped(spark) -> None:  # noqa: ANN001
    rows = [
        ("{topic}", 0, 0, b'{{"id": 1, "amount": 2.5}}'),
        ("{topic}", 0, 1, b'{{"id": 2, "amount": -1}}'),
        ("{topic}", 1, 0, b"not json"),
    ]
    df = spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT, value BINARY")
    out = [r.asDict() for r in transform(df).collect()]
    assert [(r["partition"], r["offset"], r["key"]) for r in out] == [(0, 0, "1")]
    assert json.loads(out[0]["value"]) == {{"id": 1, "cents": 250}}
'''

README = """# {name}

A Relay pipeline: JSON events from Kafka topic `{topic}` reshaped and written exactly once to
`{output}` (Kafka transactions; read it with `isolation.level=read_committed`). Made by
`relay new pipeline {name}`; declared in `{pipelines_file}`.

- `pipeline.py`: the transform, the sink and `PIPELINE` (Relay's public contract).
- `test_pipeline.py`: the transform on a local Spark session (`.venv/bin/python -m pytest {folder}`).

Run it on the embedded stack (`relay stack up` first):

```bash
export {env}=127.0.0.1:19092      # the output cluster (here the embedded broker)
relay --pipeline {name} deploy --version v1
relay --pipeline {name} status
```

Change the code, then `relay --pipeline {name} upgrade --version v2`: blue-green, each record once.
"""


def _declaration(name: str, topic: str, partitions: int, code: Path, env: str, file: Path) -> str:
    try:
        where = code.relative_to(file.parent)
    except ValueError:
        where = code
    return (
        f"\n[pipelines.{name}]  # relay new pipeline {name}\n"
        f'topic = "{topic}"\npartitions = {partitions}\n'
        f'pipeline_code = "{where.as_posix()}"\nsecret_env = ["{env}"]\n'
    )


def new_pipeline(
    name: str,
    folder: Path,
    pipelines_file: Path,
    topic: str | None = None,
    partitions: int = 3,
    current: tuple[str, str, int] | None = None,
) -> dict:
    """Write the package into ``folder`` (which must not exist or be empty) and declare it.

    ``current`` (name, topic, partitions) is the pipeline the environment runs today: a new pipelines
    file declares it first, as the default, so ``relay`` without ``--pipeline`` does what it did.
    """
    if not PACKAGE_NAME.match(name):
        raise ConfigError(f"pipeline name {name!r}: 1-63 lower-case letters, digits or '_', a letter first")
    topic = topic or name
    if not TOPIC.match(topic):
        raise ConfigError(f"topic {topic!r}: 1-249 letters, digits, '.', '_' or '-'")
    if not 1 <= partitions <= 10_000:
        raise ConfigError(f"partitions must be within 1-10000, got {partitions}")
    folder = folder.resolve()
    if folder.name != name:
        folder = folder / name  # the package folder's name is the pipeline's (an importable package)
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} exists and is not empty: choose another --folder")
    before = pipelines_file.read_text(encoding="utf-8") if pipelines_file.is_file() else None
    if before is not None and name in read_pipelines_file(pipelines_file).pipelines:
        raise ConfigError(f"{pipelines_file} already declares a pipeline {name!r}")
    env = f"{name.upper()}_BOOTSTRAP"
    values = {"name": name, "topic": topic, "output": f"{topic}_out", "env": env}
    text = before
    if text is None:
        text = "# Relay's pipelines (docs/operations.md); secrets never go here: secret_env names them.\n"
        if current is not None:
            text += (
                f'\ndefault = "{current[0]}"\n\n[pipelines.{current[0]}]\n'
                f'topic = "{current[1]}"\npartitions = {current[2]}\n'
            )
    text += _declaration(name, topic, partitions, folder, env, pipelines_file)
    pipelines_file.parent.mkdir(parents=True, exist_ok=True)
    staged = pipelines_file.with_name(f".{pipelines_file.name}.new")
    staged.write_text(text, encoding="utf-8")
    created = [d for d in (folder, *folder.parents) if not d.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "__init__.py": "",
        "pipeline.py": PIPELINE_PY.format(**values),
        "test_pipeline.py": TEST_PY.format(**values),
        "README.md": README.format(**values, folder=folder, pipelines_file=pipelines_file),
    }
    for file_name, content in files.items():
        (folder / file_name).write_text(content)
    try:
        read_pipelines_file(staged)  # as `relay` will read it (the code folder must exist by then)
    except ConfigError as exc:  # refused: what this call wrote goes again
        staged.unlink()
        for file_name in files:
            (folder / file_name).unlink()
        for d in created:
            d.rmdir()
        raise ConfigError(str(exc).replace(str(staged), str(pipelines_file))) from None
    staged.replace(pipelines_file)
    return {
        "pipeline": name,
        "folder": str(folder),
        "pipelines_file": str(pipelines_file),
        "topic": topic,
        "output_topic": values["output"],
        "next": [
            f".venv/bin/python -m pytest {folder}",
            f"export {env}=<output bootstrap, e.g. 127.0.0.1:19092>",
            f"relay --pipeline {name} deploy --version v1",
        ],
    }


__all__ = ["new_pipeline"]
