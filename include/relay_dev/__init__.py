"""Developer tooling for Relay: the embedded stack, the demo, benchmarks and the chaos run.

Never shipped in a job artifact (``relay.artifacts`` packs ``relay`` and ``spark_jobs`` only); the
runtime library does not import it.
"""
