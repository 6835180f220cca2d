"""`python -m infra ...`: see infra/cli.py."""

import sys

from common.pipes import run_until_pipe_closes
from infra.cli import main

sys.exit(run_until_pipe_closes(main))
