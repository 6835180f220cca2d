import sys

from training import startup

startup.listen()  # before the imports below, which take seconds

from training.cli import main  # noqa: E402

sys.exit(main())
