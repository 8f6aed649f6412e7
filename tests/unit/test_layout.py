"""The layout keeps its promises: the runtime library stays free of Airflow, pyspark and the developer
tooling, and a job artifact carries only the runtime."""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

from relay.artifacts import build_artifact
from relay.config import PROJECT_ROOT, RelayConfig

RUNTIME = PROJECT_ROOT / "include" / "relay"


def _module_level_imports(path: Path) -> set[str]:
    """Top-level package names imported at module level (not inside a function)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _any_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_runtime_library_imports_neither_airflow_nor_pyspark_at_module_level() -> None:
    offenders = {
        str(p.relative_to(RUNTIME)): sorted(_module_level_imports(p) & {"airflow", "pyspark"})
        for p in RUNTIME.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_runtime_library_never_imports_the_developer_tooling() -> None:
    users = sorted(
        str(p.relative_to(RUNTIME)) for p in RUNTIME.rglob("*.py") if "relay_dev" in _any_level_imports(p)
    )
    assert users == ["cli/parser.py"]  # the optional registration of the developer subcommands, nothing else


def test_nothing_that_runs_in_production_imports_the_rest_client() -> None:
    """``apache-airflow-client`` drives Airflow's REST API for the dev tooling and the tests only: the
    runtime, the DAGs and the plugin never need it (the runtime's health check reads
    ``/api/v2/monitor/health`` with requests, see ``relay.health.checks_airflow``)."""
    roots = (RUNTIME, PROJECT_ROOT / "dags", PROJECT_ROOT / "plugins")
    users = sorted(
        str(p.relative_to(PROJECT_ROOT))
        for root in roots
        for p in root.rglob("*.py")
        if "airflow_client" in _any_level_imports(p)
    )
    assert users == []


def test_the_library_is_grouped_by_concept() -> None:
    """One folder per concept (issue #16); flat beside them only what every concept shares."""
    flat = sorted(p.name for p in RUNTIME.glob("*.py"))
    assert flat == ["__init__.py", "crashpoints.py", "errors.py", "polling.py"]
    folders = sorted(p.name for p in RUNTIME.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == [
        "artifacts",
        "audit",
        "cli",
        "config",
        "health",
        "kafka",
        "ledger",
        "metrics",
        "operations",
        "pipeline",
        "protocol",
        "sinks",
        "spark",
    ]


def _relay_modules(path: Path) -> set[str]:
    """The ``relay.*`` modules a file imports, at any level (``from relay.x import y``: ``relay.x``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("relay.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names |= {node.module} if (node.module or "").startswith("relay.") else set()
    return names


def test_the_ledger_knows_no_sink_and_the_protocol_no_sink_but_the_contract() -> None:
    """The ledger holds Relay's own tables (a sink creates its own); the commit protocol talks to
    sinks only through the contract in ``relay.sinks.base``."""
    ledger = {
        str(p.relative_to(RUNTIME)): sorted(m for m in _relay_modules(p) if m.startswith("relay.sinks"))
        for p in (RUNTIME / "ledger").rglob("*.py")
    }
    assert {k: v for k, v in ledger.items() if v} == {}
    protocol = {
        str(p.relative_to(RUNTIME)): sorted(
            m for m in _relay_modules(p) if m.startswith("relay.sinks") and m != "relay.sinks.base"
        )
        for p in (RUNTIME / "protocol").rglob("*.py")
    }
    assert {k: v for k, v in protocol.items() if v} == {}


def test_job_artifact_carries_no_developer_tooling(tmp_path: Path) -> None:
    art = build_artifact(RelayConfig(data_dir=tmp_path), "v1")
    names = zipfile.ZipFile(art.folder / "relay_job.zip").namelist()
    assert "relay/ledger/store.py" in names and "kafka_source.py" in names
    assert [n for n in names if n.startswith("relay_dev") or "/stack" in n or "chaos" in n] == []


def test_the_plugins_folder_is_the_provider_package_only() -> None:
    """What the embedded Airflow loads from ``plugins/`` is what the provider's wheel ships
    (``pyproject.toml`` packages ``relay_airflow``): a module beside it would work in the dev stack
    and be missing from every installed Airflow."""
    entries = sorted(p.name for p in (PROJECT_ROOT / "plugins").iterdir() if p.name != "__pycache__")
    assert entries == ["relay_airflow"]


def test_the_dags_import_only_what_an_installed_provider_brings() -> None:
    """The DAG files run in any Airflow with the provider installed (docs/deploy.md): Airflow, the
    two packages of the wheel and the standard library, never the developer tooling."""
    allowed = {"airflow", "relay", "relay_airflow"} | set(sys.stdlib_module_names)
    offenders = {
        p.name: sorted(_any_level_imports(p) - allowed) for p in (PROJECT_ROOT / "dags").glob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
