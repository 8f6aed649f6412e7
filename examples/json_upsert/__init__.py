"""Example pipeline: JSON records upserted by id into PostgreSQL (see README.md)."""
