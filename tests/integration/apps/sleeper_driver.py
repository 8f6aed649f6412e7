"""A cluster-mode driver that only holds its cores and memory on a worker (no SparkContext, so no
executor): the room test fills the cluster with it. Usage: sleeper_driver.py SECONDS (bounded: the
test kills it through the REST API long before)."""

import sys
import time

if __name__ == "__main__":
    time.sleep(float(sys.argv[1] if len(sys.argv) > 1 else 300))
