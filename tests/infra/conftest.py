"""The loopback two-node Slurm cluster (tests/support/slurm.py) for the cluster tests and for
the commands on a cluster stack (tests/infra/commands/test_cluster_stack.py)."""

from tests.support.slurm import slurm, slurm_session  # noqa: F401 (fixtures: pytest finds them)
