"""Sparing Spark's look-up of installed Python data sources (issue #31: a driver's start).

What a user would check: with no ``pyspark_*`` package installed, Relay's source registers and reads
without Spark starting its look-up process; with one installed, Spark still finds that package's
source by name (the look-up is not spared). Each case runs in a Python process of its own: Spark
keeps the look-up's answer for its JVM's life, and a test process shares one JVM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import private_data_dir
from tests.integration.helpers import script_result

pytestmark = pytest.mark.integration


SCRIPT = r"""
import json, sys
from pathlib import Path
from local_session import local_session
import kafka_source
from kafka_source_options import spare_data_source_lookup

spark = local_session("test_source_lookup", Path(sys.argv[1]))
jvm = spark._jvm
manager = getattr(getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$")
spared = spare_data_source_lookup(spark)
preset = not manager.dataSourceBuilders().isEmpty()
kafka_source.register(spark)
ours = spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("relaykafka")
installed = None
if len(sys.argv) > 2:  # the installed package's source, found by its name
    installed = spark.read.format(sys.argv[2]).load().collect()[0][0]
print("RESULT " + json.dumps({"spared": spared, "preset": preset, "ours": ours, "installed": installed}))
spark.stop()
"""

PACKAGE = """
from pyspark.sql.datasource import DataSource, DataSourceReader


class Reader(DataSourceReader):
    def read(self, partition):
        yield ("found",)


class DefaultSource(DataSource):
    @classmethod
    def name(cls):
        return "relay_lookup_check"

    def schema(self):
        return "v string"

    def reader(self, schema):
        return Reader()
"""


def _run(work: Path, extra_path: Path | None, *args: str) -> dict:
    return script_result(SCRIPT, work, *args, extra_paths=(extra_path,) if extra_path else ())


def test_no_installed_source_spares_the_look_up_and_relays_source_registers() -> None:
    result = _run(private_data_dir("lookup-none"), None)
    assert result == {"spared": True, "preset": True, "ours": True, "installed": None}


def test_an_installed_source_is_still_found_by_its_name() -> None:
    work = private_data_dir("lookup-pkg")
    site = work / "site"
    site.mkdir()
    (site / "pyspark_relay_lookup_check.py").write_text(PACKAGE)
    result = _run(work, site, "relay_lookup_check")
    assert result == {"spared": False, "preset": False, "ours": True, "installed": "found"}
