"""`python -m infra ...`: see infra/cli.py."""

import sys

from infra.cli import run

sys.exit(run())
