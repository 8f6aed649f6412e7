"""The Relay page's FastAPI app, mounted by Airflow's api-server under ``/relay``.

One HTML page, its static files (our JS/CSS and the vendored uPlot), Prometheus metrics
(``/metrics``: relay.metrics) and three JSON endpoints per pipeline: ``overview`` (instances, latest
health report, dead letters), ``plots`` (lag, throughput, batch duration, cursors, dead letters over
time) and ``timeline`` (instances, upgrades with H, recoveries, gaps). Every route depends on
:func:`relay_airflow.page.auth.require_user`.

The ledger URL and the Kafka bootstrap come from the same place as the DAGs' (the ``relay_*``
connections over ``RELAY_*``), read at most every ``CONFIG_TTL_S``. Data endpoints are plain ``def``
so FastAPI runs them in its thread pool: a slow ledger or Kafka never blocks the api-server's loop.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from relay.config import RelayConfig
from relay.errors import RelayError
from relay.ledger.store import Ledger

from relay_airflow.page import readings
from relay_airflow.page.auth import require_user

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".txt": "text/plain"}
URL_PREFIX = "/relay"
CONFIG_TTL_S = 30.0
MAX_HOURS = 24 * 14
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

User = Annotated[Any, Depends(require_user)]
Hours = Annotated[float, Query(gt=0, le=MAX_HOURS, description="window: the last N hours")]


class _Settings:
    """The Relay configuration and one pooled Ledger per URL, refreshed every ``CONFIG_TTL_S``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config: RelayConfig | None = None
        self._read_at = 0.0
        self._ledgers: dict[str, Ledger] = {}

    def config(self) -> RelayConfig:
        with self._lock:
            if self._config is None or time.monotonic() - self._read_at > CONFIG_TTL_S:
                from relay_airflow.config import relay_config_from_connections

                try:
                    self._config = relay_config_from_connections()
                except RelayError as exc:  # a broken connection: say which, as a 503
                    raise HTTPException(status_code=503, detail=f"configuration: {exc}") from None
                self._read_at = time.monotonic()
            return self._config

    def ledger(self) -> Ledger:
        url = self.config().ledger_url
        with self._lock:
            if url not in self._ledgers:
                self._ledgers[url] = Ledger(url)
            return self._ledgers[url]


settings = _Settings()


def _ledger_call(fn: Any, *args: Any) -> Any:
    """Run a reading; an unreachable or missing ledger is a 503 that says which one."""
    try:
        return fn(*args)
    except RelayError as exc:
        raise HTTPException(status_code=503, detail=f"ledger: {exc}") from None


def _known(pipeline: str) -> Ledger:
    ledger = settings.ledger()
    if pipeline not in _ledger_call(readings.pipelines, ledger):
        raise HTTPException(status_code=404, detail=f"no pipeline {pipeline!r} in the ledger")
    return ledger


def _json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers=SECURITY_HEADERS)


def create_app() -> FastAPI:
    """The app Airflow mounts (see ``relay_airflow.plugin.RelayPlugin.fastapi_apps``)."""
    app = FastAPI(title="Relay", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        """The page itself answers a person with a login link; the API answers JSON."""
        root, path = request.scope.get("root_path", ""), request.url.path
        if exc.status_code == 401 and path.removeprefix(root) in ("", "/"):
            body = (
                "<!doctype html><title>Relay</title><p>Not logged in to Airflow. "
                '<a href="/" target="_top">Log in</a>, then open the Relay page again.</p>'
            )
            return HTMLResponse(body, status_code=401, headers=exc.headers)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request, _user: User) -> HTMLResponse:
        """The page; ``<base>`` makes its relative URLs work whatever the mount prefix."""
        base = request.scope.get("root_path", URL_PREFIX).rstrip("/") + "/"
        html = (STATIC / "index.html").read_text().replace("{{BASE}}", base)
        return HTMLResponse(html, headers=SECURITY_HEADERS)

    @app.get("/static/{name}")
    def static(name: str, _user: User) -> FileResponse:
        path = STATIC / name
        kind = STATIC_TYPES.get(path.suffix)
        if kind is None or "/" in name or name.startswith(".") or not path.is_file():
            raise HTTPException(status_code=404, detail="not found")
        return FileResponse(
            path, media_type=kind, headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
        )

    @app.get("/metrics")
    def metrics(_user: User) -> Response:
        """Prometheus' text format for every declared pipeline (relay.metrics); a bearer token."""
        from relay.metrics.serve import declared_configs, exposition

        from relay_airflow.config import relay_config_from_connections

        def configs() -> list[RelayConfig]:
            return [relay_config_from_connections(base=c) for c in declared_configs()]

        body, kind = exposition(configs)
        return Response(body, media_type=kind, headers={"Cache-Control": "no-store"})

    @app.get("/api/pipelines")
    def list_pipelines(_user: User) -> JSONResponse:
        config = settings.config()
        names = _ledger_call(readings.pipelines, settings.ledger())
        default = config.pipeline if config.pipeline in names else (names[0] if names else None)
        return _json({"pipelines": names, "default": default, "ledger": settings.ledger().safe_url})

    @app.get("/api/pipelines/{pipeline}/overview")
    def overview(pipeline: str, _user: User) -> JSONResponse:
        return _json(_ledger_call(readings.overview, _known(pipeline), pipeline, time.time()))

    @app.get("/api/pipelines/{pipeline}/plots")
    def plots(pipeline: str, _user: User, hours: Hours = 6.0) -> JSONResponse:
        now = time.time()
        ledger, bootstrap = _known(pipeline), settings.config().kafka_bootstrap
        return _json(_ledger_call(readings.plots, ledger, pipeline, now - hours * 3600, now, bootstrap))

    @app.get("/api/pipelines/{pipeline}/timeline")
    def timeline(pipeline: str, _user: User, hours: Hours = 6.0) -> JSONResponse:
        now = time.time()
        return _json(_ledger_call(readings.history, _known(pipeline), pipeline, now - hours * 3600, now))

    return app


app = create_app()
