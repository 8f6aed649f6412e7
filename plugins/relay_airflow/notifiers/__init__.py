"""Airflow notifiers of Relay: how a failed run (a CRITICAL health report above all) reaches a person."""

from relay_airflow.notifiers.relay_alert import HealthCriticalError, RelayAlertNotifier, alert_payload

__all__ = ["HealthCriticalError", "RelayAlertNotifier", "alert_payload"]
