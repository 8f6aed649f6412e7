#!/usr/bin/env bash
# Idempotent setup of a fresh Debian 12 machine (as root, CI=true, no stdin): Java and PostgreSQL from
# apt when missing, uv, the .venv from the locked requirements.txt, and the relay package (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.relay-setup.stamp"
export DEBIAN_FRONTEND=noninteractive
export UV_NATIVE_TLS="${UV_NATIVE_TLS:-1}"  # trust the system CA store (proxies with their own CA)

log() { echo "setup: $*" >&2; }

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need_apt+=(postgresql)
command -v spin >/dev/null 2>&1 || need_apt+=(spin)  # the model check (make model)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)    # spin preprocesses with it; pan is compiled by it
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || need_apt+=(chromium chromium-driver)  # the browser checks
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)  # scrapes Relay in the tests; promtool checks the rules
if [ "${#need_apt[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  log "installing ${need_apt[*]}"
  $SUDO apt-get update -q </dev/null
  $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}" </dev/null
fi

if ! command -v uv >/dev/null 2>&1; then
  log "installing uv"
  python3 -m pip install -q uv </dev/null || python3 -m pip install -q --break-system-packages uv </dev/null
fi

want="$(sha256sum requirements.txt include/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  log "environment up to date (requirements.txt unchanged)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; uv venv --python 3.11 "$VENV"; }
export VIRTUAL_ENV="$VENV"
log "syncing requirements.txt"
# --compile-bytecode: uv installs no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI
# images, this machine) every Python process then compiles what it imports from source, every time:
# measured 1.3 s of compile() in a Spark Python worker's first Kafka read (pyarrow -> pandas), more in
# each Airflow process. ~30 s once here instead.
uv pip sync --python "$VENV/bin/python" --compile-bytecode requirements.txt \
  || uv pip install --python "$VENV/bin/python" --compile-bytecode -r requirements.txt
uv pip install --python "$VENV/bin/python" -e include --no-deps
echo "$want" > "$STAMP"
log "done"
