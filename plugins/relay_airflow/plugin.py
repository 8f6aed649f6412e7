"""Relay's AirflowPlugin: the Relay page (a FastAPI app under /relay and its entry in the UI's nav).

Hooks, operators and sensors are plain importable modules in ``relay_airflow`` (Airflow 3 no longer
registers them through plugins). Installed as a package, Airflow finds this class through the
``airflow.plugins`` entry point and the connection types through the provider's
``get_provider_info``; the embedded stack loads it from its plugins folder (``plugins/``).

The page is an ``external_view`` with a ``url_route``: Airflow's UI shows it in its own frame at
``/plugin/relay``, as a top-level nav entry, and the frame loads ``/relay/`` from the same origin, so the
UI's ``_token`` cookie reaches the page's own authentication (see ``relay_airflow.page.auth``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from relay_airflow.page.app import URL_PREFIX, app


class RelayPlugin(AirflowPlugin):
    name = "relay"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Relay page"}]
    external_views = [
        {
            "name": "Relay",
            "href": f"{URL_PREFIX}/",
            "url_route": "relay",
            "destination": "nav",
            "nav_top_level": True,
            "icon": f"{URL_PREFIX}/static/icon.svg",
        }
    ]
