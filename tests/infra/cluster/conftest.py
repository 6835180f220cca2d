"""The loopback two-node Slurm cluster (tests/support/slurm.py) for the cluster tests."""

from tests.support.slurm import slurm  # noqa: F401 (a fixture: pytest finds it here)
