"""Relay's AirflowPlugin: registers the plugin so the UI's Plugins page shows Relay is loaded.

Hooks, operators and sensors are plain importable modules in ``relay_airflow`` (Airflow 3 no longer
registers them through plugins); connection types are only a naming convention here.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class RelayPlugin(AirflowPlugin):
    name = "relay"
