#!/usr/bin/env bash
# Model-check the protocol (model/relay.pml) with spin: exit 0 when the real model passes and every
# mutant fails with its expected invariant violation. Arguments go to model/check.py (--help).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=".venv/bin/python"
[ -x "$PY" ] || PY="python3"
exec "$PY" model/check.py "$@"
