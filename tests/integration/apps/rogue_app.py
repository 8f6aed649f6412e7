"""A Spark application started behind Relay's back: it holds a SparkContext for a bounded time.

Usage: rogue_app.py SECONDS. The app name comes from spark.app.name of the submission.
"""

import sys
import time

from pyspark.sql import SparkSession

if __name__ == "__main__":
    spark = SparkSession.builder.getOrCreate()
    deadline = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 300)
    while time.time() < deadline:  # bounded: the test kills it through the REST API long before
        time.sleep(1)
    spark.stop()
