"""What a pipeline's sink declares (type, target table or topic, key columns), read without building it.

Kept apart from building artifacts in ``relay.artifacts``: a version's ``artifact.json`` records it
(``sink_declares``) so an upgrade plan can compare two versions' sinks, but reading it is a job of
its own: a sink factory is never called (it reads its settings from the driver's environment), so
its source is parsed instead.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.pipeline import Pipeline

SINK_ARGUMENTS = ("table", "schema", "topic", "key", "key_column")
_UNKNOWN = object()


def sink_declares(pipeline: Pipeline) -> dict[str, Any]:
    """The sink's type, target (table or topic) and key columns, for comparing two versions.

    A sink factory is never called here: it reads its settings (a database URL) from the driver's
    environment. Its source is read instead: the one sink class it constructs gives the type, and
    arguments count only when they are literals or module constants (otherwise None: unknown).
    ``key`` [] means records carry no key (a Kafka sink without ``key_column``).
    """
    from relay.pipeline import ForEachBatch, _is_sink

    sink = pipeline.sink
    if isinstance(sink, ForEachBatch) or _is_sink(sink):
        values = {a: getattr(sink, a) for a in SINK_ARGUMENTS if hasattr(sink, a)}
        return _declared(type(sink).__name__, values, "instance")
    unknown = {"type": None, "target": None, "key": None, "read_from": "unknown (a sink factory)"}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(sink)))
    except (OSError, TypeError, SyntaxError):
        return unknown
    scope = getattr(sink, "__globals__", {})
    calls = [
        (cls, node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(cls := _resolve(node.func, scope), type)
        and (cls is ForEachBatch or all(callable(getattr(cls, m, None)) for m in ("prepare", "write_task")))
    ]
    if len({cls for cls, _ in calls}) != 1:
        return unknown  # none, or several sink classes: which one is built is decided at run time
    found = [_call_values(cls, node, scope) for cls, node in calls]
    if any(f != found[0] for f in found):
        found = [None]
    return _declared(calls[0][0].__name__, found[0] or {}, "the factory's source")


def _declared(kind: str, values: dict[str, Any], read_from: str) -> dict[str, Any]:
    def text(name: str) -> str | None:
        return values[name] if isinstance(values.get(name), str) else None

    key: list[str] | None = None
    if isinstance(values.get("key"), list | tuple) and all(isinstance(k, str) for k in values["key"]):
        key = list(values["key"])
    elif "key_column" in values and (values["key_column"] is None or text("key_column")):
        key = [values["key_column"]] if values["key_column"] else []
    table, schema = text("table"), text("schema")
    target = f"{schema}.{table}" if table and schema else table or text("topic")
    return {"type": kind, "target": target, "key": key, "read_from": read_from}


def _resolve(node: ast.expr, scope: dict) -> Any:
    """``Name`` or ``module.Name`` to the object it names in the factory's module (else None)."""
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, scope)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


def _call_values(cls: type, call: ast.Call, scope: dict) -> dict[str, Any] | None:
    """The sink arguments of a constructor call that are literals or module constants (None: the
    call can't be read, e.g. ``*args``)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        params = inspect.signature(cls).parameters
        keywords = {str(k.arg): k.value for k in call.keywords}
        bound = inspect.signature(cls).bind_partial(*call.args, **keywords)
    except (TypeError, ValueError):
        return None
    values: dict[str, Any] = {}
    for name in SINK_ARGUMENTS:
        if name in bound.arguments:
            values[name] = _literal(bound.arguments[name], scope)
        elif name in params and params[name].default is not inspect.Parameter.empty:
            values[name] = params[name].default
        elif isinstance(getattr(cls, name, None), str):  # a class constant (the counter's table)
            values[name] = getattr(cls, name)
    return {k: v for k, v in values.items() if v is not _UNKNOWN}


def _literal(node: ast.expr, scope: dict) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        pass
    if isinstance(node, ast.Name) and isinstance(scope.get(node.id), str | list | tuple):
        return scope[node.id]
    return _UNKNOWN
