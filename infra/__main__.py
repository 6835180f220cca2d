"""`python -m infra ...`: see infra/cli.py."""

import sys

from infra.cli import COMMANDS, main
from infra.dryrun.plan_command import with_resources

# `plan --resources`: run the real Pulumi program offline and list what it creates.
COMMANDS["plan"] = with_resources(*COMMANDS["plan"])

sys.exit(main())
