"""The loopback two-node Slurm cluster (tests/support/slurm.py) for the cluster tests and for
the commands on a cluster stack (tests/infra/commands/test_cluster_stack.py)."""

from tests.support.slurm import slurm  # noqa: F401 (a fixture: pytest finds it here)
