"""Example pipeline: the seeds' counter, the reference job rewritten on the pipeline SDK (see README.md)."""
