"""The executor-side sink contract and the PostgreSQL upsert sink's checks that need no database."""

from __future__ import annotations

import pickle
import uuid

import pytest
from relay.errors import ConfigError
from relay.sinks import pg_conn
from relay.sinks.base import SinkError, TaskContext, TaskResult
from relay.sinks.pg_schema import create_table_sql
from relay.sinks.pg_values import adapt
from relay.sinks.postgres_upsert import PostgresUpsertSink

URL = "postgresql+psycopg2://writer:S3cr%40t-pw@db.example:5432/sinkdb"
SECRET = "S3cr%40t-pw"
DECODED = "S3cr@t-pw"


def ctx(**ranges: tuple[int, int]) -> TaskContext:
    return TaskContext("p", 1, 7, 3, {("t", int(p[1:])): r for p, r in ranges.items()})


def test_allows_is_half_open_and_per_partition() -> None:
    c = ctx(p0=(10, 20))
    assert c.allows("t", 0, 10) and c.allows("t", 0, 19)
    assert not c.allows("t", 0, 9) and not c.allows("t", 0, 20)
    assert not c.allows("t", 1, 15) and not c.allows("other", 0, 15)
    assert not ctx().allows("t", 0, 0)


def test_task_results_add_up_with_their_extras() -> None:
    a = TaskResult(10, 6, 2, 2, {"inserted": 4, "updated": 2, "note": "a"})
    b = TaskResult(5, 1, 0, 4, {"inserted": 1, "note": "b", "only_b": 3})
    total = a.add(b)
    assert (total.rows_in, total.rows_written, total.rows_skipped, total.rows_unchanged) == (15, 7, 2, 6)
    assert total.extra == {"inserted": 5, "updated": 2, "note": "b", "only_b": 3}
    assert a.extra["inserted"] == 4  # add returns a new result
    assert TaskResult().add(TaskResult()) == TaskResult()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": []}, "at least one column"),
        ({"key": "id"}, "sequence of column names"),
        ({"key": ["id", "id"]}, "more than once"),
        ({"key": ["id"], "columns": ["name"]}, "not among the row columns"),
        ({"key": ["_relay_offset"]}, "Relay's own columns"),
        ({"key": ["id"], "columns": ["id", "_relay_topic"]}, "Relay's own columns"),
        ({"key": [""]}, "non-empty"),
        ({"key": ["x" * 64]}, "63 bytes"),
        ({"key": ["a\x00b"]}, "NUL"),
        ({"key": ["id"], "table": "public.items"}, "schema=..."),
        ({"key": ["id"], "table": ""}, "table must be a non-empty"),
        ({"key": ["id"], "schema": ""}, "schema must be a non-empty"),
        ({"key": ["id"], "page_size": 0}, "page_size"),
        ({"key": ["id"], "fence_wait_s": 0}, "fence_wait_s"),
    ],
)
def test_bad_arguments_are_refused_clearly(kwargs: dict, message: str) -> None:
    args = {"url": URL, "table": "items", **kwargs}
    with pytest.raises(ConfigError, match=message):
        PostgresUpsertSink(**args)


def test_another_scheme_is_refused_without_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        PostgresUpsertSink("mysql://writer:S3cr%40t-pw@db/x", "items", ["id"])
    assert SECRET not in str(info.value) and DECODED not in str(info.value)


def test_repr_str_and_url_mask_the_password_and_pickling_keeps_the_sink_usable() -> None:
    sink = PostgresUpsertSink(URL, "items", ["id"], ["id", "name"], schema="app")
    for text in (repr(sink), str(sink), sink.url):
        assert SECRET not in text and DECODED not in text and "***" in text
    assert "app.items" in repr(sink)
    again = pickle.loads(pickle.dumps(sink))
    assert again.key == ("id",) and again.columns == ("id", "name") and repr(again) == repr(sink)


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        (URL, {SECRET, DECODED}),
        ("postgresql://u:p@ss@h/db", {"p@ss"}),  # an unencoded @ in the password
        ("postgresql://u@h/db?password=topsecret", {"topsecret"}),
        ("postgresql://h/db", set()),
    ],
)
def test_scrub_removes_every_spelling_of_the_password(url: str, secrets: set[str]) -> None:
    assert set(pg_conn.secrets_of(url)) == secrets
    text = " ".join(["error near", *secrets, "end"])
    assert all(s not in pg_conn.scrub(text, url) for s in secrets)


def test_libpq_url_drops_the_sqlalchemy_driver() -> None:
    assert pg_conn.libpq_url("postgresql+psycopg2://u:p@h:1/d") == "postgresql://u:p@h:1/d"
    assert pg_conn.libpq_url("postgres://h/d") == "postgresql://h/d"


def test_values_are_adapted_or_refused_naming_the_column() -> None:
    assert adapt(None, "c") is None and adapt("x", "c") == "x" and adapt(3, "c") == 3
    assert adapt(True, "c") is True and adapt(1.5, "c") == 1.5
    assert bytes(adapt(b"\x00\xff", "c").adapted) == b"\x00\xff"
    assert adapt({"a": [1, 2]}, "c").adapted == '{"a":[1,2]}'
    u = uuid.uuid4()
    assert adapt(u, "c") == str(u)
    with pytest.raises(SinkError, match="column 'payload'.*type object"):
        adapt(object(), "payload")
    with pytest.raises(SinkError, match="column 'doc'.*JSON"):
        adapt({"x": {1, 2}}, "doc")
    with pytest.raises(SinkError, match="column 'name'.*NUL"):
        adapt("a\x00b", "name")


def test_create_table_sql_checks_names_and_types() -> None:
    with pytest.raises(ConfigError, match="no type"):
        create_table_sql("items", ["id"], {"name": "text"})
    with pytest.raises(ConfigError, match="plain SQL type"):
        create_table_sql("items", ["id"], {"id": "bigint); DROP TABLE x; --"})
    with pytest.raises(ConfigError, match="Relay's own"):
        create_table_sql("items", ["id"], {"id": "bigint", "_relay_topic": "text"})
