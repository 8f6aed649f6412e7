#!/usr/bin/env bash
# Build the provider's wheel (pyproject.toml: relay + relay_airflow, no relay_dev) into $1 (default
# var/dist) and print its path. The build runs in a scratch copy of the four inputs: setuptools leaves
# relay_airflow_provider.egg-info beside pyproject.toml, and at the repository's root (on pytest's
# pythonpath) its entry points would register the provider, and the plugin a second time, in the
# development environment.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-var/dist}" && cd "${1:-var/dist}" && pwd)"
mkdir -p var
WORK="$(mktemp -d "$PWD/var/provider-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cp -r pyproject.toml README.md "$WORK/"
mkdir -p "$WORK/include" "$WORK/plugins"
cp -r include/relay "$WORK/include/"
cp -r plugins/relay_airflow "$WORK/plugins/"
find "$WORK" -name __pycache__ -type d -prune -exec rm -rf {} +
export UV_NATIVE_TLS="${UV_NATIVE_TLS:-1}"  # as scripts/setup.sh: setuptools comes from the index or uv's cache
uv build -q --wheel -o "$OUT" "$WORK" >&2
ls -t "$OUT"/relay_airflow_provider-*.whl | head -1
