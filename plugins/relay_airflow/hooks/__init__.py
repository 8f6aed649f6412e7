"""Hooks: each builds one library client from one Airflow connection."""
