"""``relay metrics serve``: the collector on an HTTP port of its own, for a deployment without the
Relay page (the page serves the same at ``/relay/metrics``), and the exposition both use."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server

from relay.config import RelayConfig, load_config, pipeline_names
from relay.metrics.collect import RelayCollector


def declared_configs(env: Mapping[str, str] | None = None) -> list[RelayConfig]:
    """Every pipeline one can act on here (the pipelines file's, else the environment's one)."""
    names, _ = pipeline_names(env)
    return [load_config(env, pipeline=name) for name in names]


def registry_of(configs: Callable[[], Sequence[RelayConfig]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(configs))
    return registry


def exposition(configs: Callable[[], Sequence[RelayConfig]]) -> tuple[bytes, str]:
    """The text format of one scrape, and its content type."""
    return generate_latest(registry_of(configs)), CONTENT_TYPE_LATEST


def serve(host: str, port: int, progress: Callable[[str], None], stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set (or for ever): each scrape reads the ledger and Kafka anew."""
    server, thread = start_http_server(port, addr=host, registry=registry_of(declared_configs))
    progress(f"serving Relay's metrics at http://{host}:{port}/metrics")
    try:
        (stop or threading.Event()).wait()
    finally:
        server.shutdown()
        thread.join(5)
