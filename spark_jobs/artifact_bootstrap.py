"""The driver Relay submits when artifacts live in the ledger (``RELAY_ARTIFACT_STORE=ledger``).

Part of the installed runtime (present on every host), never of an artifact: the master may start a
driver on any worker, where the submitter's ``artifacts/`` folder does not exist. This script
fetches its version's artifact (driver script + zip) from the ledger (the driver already gets the
ledger URL in its environment), checks its code hash against the hash the submission names, puts
the zip first on ``sys.path`` (the live tree's folders removed, so they cannot shadow the version),
tells the driver to ship the zip to its executors (``RELAY_ARTIFACT_ZIP``, see
``driver_checks.ship_artifact``) and runs the version's driver in this process.

It imports nothing of Relay (which Relay? the version's code is not there yet): SQLAlchemy only.
Exit codes follow the drivers': under supervision a missing or altered artifact exits 0 (a relaunch
cannot fix it), an unreachable ledger exits 1 (the relaunch may find it back).

``python artifact_bootstrap.py --pipeline P --version V --code-hash H -- <driver arguments>``
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import os
import runpy
import sys
import zipfile
from pathlib import Path

LEDGER_URL_ENV = "RELAY_LEDGER_URL"
ARTIFACT_ZIP_ENV = "RELAY_ARTIFACT_ZIP"
VERSION_MODULE = "relay_job_version.py"  # relay.artifacts.VERSION_MODULE
DRIVER_MEMBER = "<driver>/"  # relay.artifacts.DRIVER_MEMBER
FOLDER = "relay-artifact"  # under the driver's working folder, on the worker that runs it
ROOT = Path(__file__).resolve().parents[1]


class ArtifactProblem(Exception):
    """The artifact is missing or is not the code the submission names: a relaunch cannot fix it."""


def code_hash(members: list[tuple[str, bytes]], driver_name: str, driver_script: bytes) -> str:
    """relay.artifacts._code_hash over bytes (a unit test keeps the two equal)."""
    digest = hashlib.sha256()
    named = [(n, d.partition(b"\n")[2] if n == VERSION_MODULE else d) for n, d in members]
    for name, data in sorted([*named, (DRIVER_MEMBER + driver_name, driver_script)]):
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def zip_members(zip_bytes: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
        return [(n, zf.read(n)) for n in zf.namelist()]


def fetch(url: str, pipeline: str, version: str) -> tuple[str, bytes, bytes, str]:
    """(driver name, driver script, zip, recorded code hash) of one version, from the ledger."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url, pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT driver, driver_script, zip, code_hash FROM artifacts "
                    "WHERE pipeline = :p AND version = :v"
                ),
                {"p": pipeline, "v": version},
            ).first()
    finally:
        engine.dispose()
    if row is None:
        raise ArtifactProblem(f"the ledger holds no artifact of pipeline {pipeline} version {version}")
    return str(row[0]), bytes(row[1]), bytes(row[2]), str(row[3])


def verified(expected: str, driver: str, script: bytes, zip_bytes: bytes, recorded: str) -> None:
    """The bytes hash to what the submission names (the recorded hash alone proves nothing)."""
    found = code_hash(zip_members(zip_bytes), driver, script)
    if found != expected or recorded != expected:
        raise ArtifactProblem(
            f"artifact code hash mismatch: the submission names {expected}, the ledger records "
            f"{recorded}, its bytes hash to {found}"
        )
    if "/" in driver or driver.startswith("."):
        raise ArtifactProblem(f"artifact driver name {driver!r} is not a plain file name")


def unpack(folder: Path, driver: str, script: bytes, zip_bytes: bytes) -> tuple[Path, Path]:
    """Write the driver and the zip into ``folder`` (replaced atomically: a relaunch re-fetches)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / driver, folder / "relay_job.zip"
    for path, data in zip(paths, (script, zip_bytes), strict=True):
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)
    return paths


def clean_sys_path(zip_path: Path) -> None:
    """The version's zip first; the live tree's folders (this script's own among them) out."""
    live = {str(ROOT), str(ROOT / "include"), str(ROOT / "spark_jobs"), str(zip_path)}
    sys.path[:] = [str(zip_path), *(p for p in sys.path if p and str(Path(p).resolve()) not in live)]
    # PYTHONPATH names the zip before it exists: Python cached "no importer" for that path.
    sys.path_importer_cache.pop(str(zip_path), None)
    importlib.invalidate_caches()


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: artifact_bootstrap.py --pipeline P --version V --code-hash H -- ARGS")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="artifact_bootstrap.py")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--code-hash", required=True)
    return p.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str]) -> int:
    args, driver_args = parse(argv)
    supervised = "--supervised" in driver_args
    url = os.environ.get(LEDGER_URL_ENV, "").strip()
    try:
        if not url:
            raise ArtifactProblem(f"{LEDGER_URL_ENV} is not set: Relay passes it in the environment")
        driver, script, zip_bytes, recorded = fetch(url, args.pipeline, args.version)
        verified(args.code_hash, driver, script, zip_bytes, recorded)
    except ArtifactProblem as exc:
        print(f"relay artifact bootstrap: cannot start: {exc}", file=sys.stderr, flush=True)
        return 0 if supervised else 2
    except Exception as exc:  # noqa: BLE001 - the ledger is away: a relaunch may find it
        print(f"relay artifact bootstrap: ledger unavailable (will be relaunched): {exc}", file=sys.stderr)
        return 1
    job, zip_path = unpack(Path.cwd() / FOLDER, driver, script, zip_bytes)
    print(
        f"relay artifact bootstrap: {args.pipeline} {args.version} code {args.code_hash[:12]} "
        f"from the ledger ({len(zip_bytes)} bytes) into {job.parent}",
        flush=True,
    )
    clean_sys_path(zip_path)
    os.environ[ARTIFACT_ZIP_ENV] = str(zip_path)
    sys.argv = [str(job), *driver_args]
    runpy.run_path(str(job), run_name="__main__")  # the driver ends the process (exit_now)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
