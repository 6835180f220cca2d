"""What `run`, `jobs` and `cancel` need to know about a running stack, from its typed
outputs (infra/outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.commands import workspace


@dataclass(frozen=True)
class JobTarget:
    """The running stack a job goes to."""

    stack: workspace.Deployed
    bucket: str  # the spool's and the checkpoints' bucket
    checkpoint_uri: str  # each job's checkpoints and status.json under <uri>/<job name>
    usd_per_hour: float  # every node of the stack running

    @property
    def is_cluster(self) -> bool:
        return self.stack.is_cluster

    def run_uri(self, name: str) -> str:
        """Where job `name` keeps its checkpoints and status.json (a prefix per job name)."""
        return f"{self.checkpoint_uri.rstrip('/')}/{name}"


def job_target(name: str) -> JobTarget:
    """The outputs of stack `name` that jobs need; ConfigError when it is not up."""
    stack = workspace.deployed(name)
    outputs = stack.outputs
    return JobTarget(
        stack=stack,
        bucket=outputs.checkpoint_bucket,
        checkpoint_uri=outputs.checkpoint_uri,
        usd_per_hour=outputs.hourly_cost_usd,
    )
