"""Where a pipeline reads and writes, named twice: by OpenLineage's naming spec and as Airflow asset URIs.

Why both: lineage backends (Marquez, DataHub, ...) join jobs on OpenLineage ``(namespace, name)``,
and Airflow schedules a downstream DAG on an asset URI (AIP-60, the form the Airflow providers'
``sanitize_uri`` normalise to). One reading of an address gives both, so they always agree:

==========================  ==================================  ===================================
what                        OpenLineage namespace / name        Airflow asset URI
==========================  ==================================  ===================================
Kafka topic                 ``kafka://host:port`` / ``topic``   ``kafka://host:port/topic``
PostgreSQL table            ``postgres://host:port`` /          ``postgres://host:port/db/schema/table``
                            ``db.schema.table``
SQLite database (the        ``file`` / ``/path/ledger.db``      ``file:///path/ledger.db``
counter on a SQLite ledger)
==========================  ==================================  ===================================

Host and port come from the address Relay itself uses (the first bootstrap server; the URL of the
sink or the ledger), never a password. A port left out is the service's default (9092, 5432), as
the providers' normalisers add it. Pure string work: no Airflow, no OpenLineage client.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

from relay.errors import ConfigError

KAFKA_PORT = 9092
POSTGRES_PORT = 5432
_HOST = re.compile(r"^[A-Za-z0-9._:%-]+$")  # a DNS name, IPv4, or IPv6 (no brackets)
DEFAULT_SCHEMA = "public"  # a table named without a schema lands in the default search_path's first


@dataclass(frozen=True)
class DatasetRef:
    """One dataset: its OpenLineage ``namespace`` and ``name``, and its Airflow asset ``uri``."""

    namespace: str
    name: str
    uri: str
    kind: str
    """``kafka`` | ``postgres`` | ``file``: what it is, for messages and docs."""


def _host_port(netloc_or_server: str, default_port: int) -> tuple[str, int]:
    parsed = urlsplit(f"//{netloc_or_server.rpartition('@')[2]}")
    try:
        port = parsed.port
    except ValueError as exc:
        raise ConfigError(f"not a host:port: {netloc_or_server.rpartition('@')[2]!r}") from exc
    host = parsed.hostname or ""
    if not _HOST.match(host):
        raise ConfigError(f"no host in {netloc_or_server.rpartition('@')[2]!r}")
    if ":" in host:  # an IPv6 literal keeps its brackets in a URI authority
        host = f"[{host}]"
    return host, port or default_port


def kafka_topic(bootstrap: str | Sequence[str], topic: str) -> DatasetRef:
    """A Kafka topic, in the cluster named by its first bootstrap server (the spec's choice)."""
    servers = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    servers = [s.strip() for s in servers if s and s.strip()]
    if not servers or not topic:
        raise ConfigError(f"a Kafka dataset needs a bootstrap server and a topic: {bootstrap!r}, {topic!r}")
    host, port = _host_port(servers[0], KAFKA_PORT)
    namespace = f"kafka://{host}:{port}"
    return DatasetRef(namespace, topic, f"{namespace}/{topic}", "kafka")


def _postgres_url(url: str) -> SplitResult:
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://", "postgresql+")):
        raise ConfigError("not a PostgreSQL URL (postgresql://host:port/db)")
    return urlsplit("postgresql://" + url.split("://", 1)[1])


def postgres_table(url: str, table: str, schema: str | None = None) -> DatasetRef:
    """A PostgreSQL table of the database ``url`` names (``postgresql[+driver]://user:pw@host:port/db``).

    The database is the URL's path; without one libpq connects to the user's database, so that is
    the name. ``schema`` None: ``public``, where an unqualified table is created."""
    parsed = _postgres_url(url)
    host, port = _host_port(parsed.netloc, POSTGRES_PORT) if parsed.hostname else ("localhost", POSTGRES_PORT)
    database = unquote(parsed.path.lstrip("/")) or unquote(parsed.username or "") or "postgres"
    schema = schema or DEFAULT_SCHEMA
    namespace = f"postgres://{host}:{port}"
    return DatasetRef(
        namespace, f"{database}.{schema}.{table}", f"{namespace}/{database}/{schema}/{table}", "postgres"
    )


def sqlite_file(url: str) -> DatasetRef:
    """A SQLite database (``sqlite:////abs/path.db``): the spec names no SQLite tables, so the dataset
    is the database file, a local file (namespace ``file``, name its absolute path)."""
    if not isinstance(url, str) or not url.startswith("sqlite"):
        raise ConfigError("not a SQLite URL (sqlite:////path/to/file.db)")
    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:":
        raise ConfigError("an in-memory SQLite database is no dataset")
    path = "/" + path.lstrip("/")
    return DatasetRef("file", path, f"file://{path}", "file")


def database_table(url: str, table: str, schema: str | None = None) -> DatasetRef:
    """``table`` of a ledger-style SQLAlchemy URL: PostgreSQL by table, SQLite by its file."""
    if url.startswith("sqlite"):
        return sqlite_file(url)
    return postgres_table(url, table, schema)


def sink_dataset(sink: object) -> DatasetRef | None:
    """What a built sink writes, when it says (``sink.dataset()``: Relay's Kafka, PostgreSQL and
    counter sinks). None for a ``ForEachBatch`` or a sink of the user's: its target is whatever its
    code decides, which Relay cannot name."""
    describe = getattr(sink, "dataset", None)
    if not callable(describe):
        return None
    found = describe()
    return found if isinstance(found, DatasetRef) else None
