"""Executor-side sinks: each Spark task writes its rows in one fenced, idempotent sink transaction."""
