"""Example pipeline: ForEachBatch writing one JSON directory per batch range (see README.md)."""
