"""A tiny cluster-mode driver for the stack test: prints its environment facts and exits 0."""

import os
import sys

if __name__ == "__main__":
    print("hello from relay test driver", sys.argv[1:], flush=True)
    print("python", sys.executable, flush=True)
    print("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP"), flush=True)
    print("PYTHONPATH", os.environ.get("PYTHONPATH"), flush=True)
    import relay.config  # noqa: F401 - proves PYTHONPATH reaches the driver

    sys.exit(0)
