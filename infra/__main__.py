"""`python -m infra ...`: see infra/cli.py."""

import sys

from infra.cli import main

sys.exit(main())
