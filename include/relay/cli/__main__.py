"""``python -m relay.cli``: the ``relay`` command (tests run it this way, with the venv's Python)."""

import sys

from relay.cli import main

sys.exit(main())
