"""Example pipeline: the seeds' counter, Relay's default pipeline (see README.md)."""
