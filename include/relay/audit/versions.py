"""Each version's pipeline as it ran: its package loaded from the version's stored artifact.

The audit must judge each offset by the code that applied it, not by the code in the working tree:
so the user's package is imported from the version's zip (the ledger's artifact store when it holds
the version, as drivers on any worker fetch it, its bytes checked against the recorded code hash;
else the local ``artifacts/`` folder). Two versions share a package name: each load forgets the
previous one's modules first. Relay's own modules stay the running ones (the pipeline contract).
"""

from __future__ import annotations

import ast
import importlib
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from relay.artifacts import VERSION_MODULE, artifact, zip_code_hash
from relay.audit.sink_report import SinkAuditError
from relay.config import RelayConfig
from relay.ledger import schema as s
from relay.ledger.store import Ledger
from relay.pipeline import PIPELINE_ATTRIBUTE, Pipeline


@dataclass(frozen=True)
class VersionCode:
    """One version's zip and the pipeline module it names (None: the reference job, no package)."""

    version: str
    zip_file: Path
    module: str | None
    source: str  # where the zip came from, for the report

    @property
    def package(self) -> str | None:
        return None if self.module is None else self.module.split(".")[0]


def find(config: RelayConfig, ledger: Ledger, version: str, scratch: Path) -> VersionCode | None:
    """The version's artifact (None: neither the ledger's store nor the artifacts folder has it)."""
    t = s.artifacts
    with ledger.tx() as conn:
        found = conn.execute(
            select(t.c.code_hash, t.c.driver, t.c.driver_script, t.c.zip).where(
                t.c.pipeline == config.pipeline, t.c.version == version
            )
        ).first()
    if found is not None:
        folder = scratch / "artifacts" / version
        folder.mkdir(parents=True, exist_ok=True)
        zip_file, driver = folder / "relay_job.zip", folder / Path(found.driver).name
        zip_file.write_bytes(bytes(found.zip))
        driver.write_bytes(bytes(found.driver_script))
        if zip_code_hash(zip_file, driver) != found.code_hash:
            raise SinkAuditError(f"the ledger's artifact of version {version} does not match its code hash")
        return VersionCode(version, zip_file, _module(zip_file), "the ledger's artifact store")
    local = artifact(config, version)
    if local.exists():
        return VersionCode(version, local.zip_file, _module(local.zip_file), f"{local.folder}")
    return None


def _module(zip_file: Path) -> str | None:
    """``PIPELINE_MODULE`` of the zip's version module (None: the reference job)."""
    with zipfile.ZipFile(zip_file) as zf:
        tree = ast.parse(zf.read(VERSION_MODULE).decode())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PIPELINE_MODULE" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def load(code: VersionCode) -> Pipeline:
    """Import the version's pipeline module from its zip (never from anywhere else)."""
    if code.module is None or code.package is None:
        raise SinkAuditError(f"version {code.version} runs no pipeline package (the reference job)")
    forget(code.package)
    path = str(code.zip_file)
    sys.path.insert(0, path)
    sys.path_importer_cache.pop(path, None)  # a zip rewritten since (a rebuilt version)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(code.module)
    except Exception as exc:  # noqa: BLE001 - the user's code: name what failed
        raise SinkAuditError(
            f"version {code.version}: cannot import {code.module} from {path}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        sys.path.remove(path)
    where = str(getattr(module, "__file__", "") or "")
    if not where.startswith(path + "/"):
        raise SinkAuditError(f"version {code.version}: {code.module} was imported from {where}, not {path}")
    found = getattr(module, PIPELINE_ATTRIBUTE, None)
    if not isinstance(found, Pipeline):
        raise SinkAuditError(f"version {code.version}: {code.module} defines no {PIPELINE_ATTRIBUTE}")
    return found


def forget(package: str) -> None:
    """Drop the package's modules, so the next import reads another version's files."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
