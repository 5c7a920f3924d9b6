"""Entry point: ``python -m tools.peer_contracts`` from the repository root."""

import sys

from .cli import main

sys.exit(main())
