"""A cluster's head node as the commands reach it, played by this host and its loopback Slurm.

`HeadNodeSSM` answers the two SSM Run Command calls the commands make (SendCommand with
AWS-RunShellScript, GetCommandInvocation) by running the commands with `sh` here, as the
SSM agent does (aws/amazon-ssm-agent, agent/plugins/runscript), where
SLURM_CONF points at the loopback cluster (tests/support/slurm.py), and keeping their
output as SSM does: the first 24,000 characters of each stream
(https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_GetCommandInvocation.html).
"""

from __future__ import annotations

import subprocess
import uuid
from types import SimpleNamespace

from tests.support.slurm import SlurmCluster

SSM_OUTPUT_CHARS = 24_000


class InvocationDoesNotExist(Exception):
    pass


class InvalidInstanceId(Exception):
    """SendCommand's error for an instance whose SSM agent has not registered (yet)."""


def run_on_head_node(cluster: SlurmCluster, script: str, timeout: float = 300):
    """sh -c SCRIPT against the loopback cluster, as SSM runs it as root on a head node."""
    return subprocess.run(
        ["sh", "-c", script],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class HeadNodeSSM:
    """The SSM client of a stack whose head node is `head_node_id` (one instance only)."""

    exceptions = SimpleNamespace(
        InvocationDoesNotExist=InvocationDoesNotExist, InvalidInstanceId=InvalidInstanceId
    )

    def __init__(self, cluster: SlurmCluster, head_node_id: str):
        self.cluster, self.head_node_id = cluster, head_node_id
        self.sent: list[list[str]] = []
        self.unregistered_for = 0  # SendCommands to refuse before the agent registers
        self._results: dict[str, subprocess.CompletedProcess] = {}

    def send_command(self, *, InstanceIds, DocumentName, Parameters, **_):
        assert DocumentName == "AWS-RunShellScript"
        assert InstanceIds == [self.head_node_id], f"sent to {InstanceIds}, not the head node"
        if self.unregistered_for > 0:
            self.unregistered_for -= 1
            raise InvalidInstanceId(self.head_node_id)
        commands = Parameters["commands"]
        self.sent.append(commands)
        command_id = str(uuid.uuid4())
        self._results[command_id] = run_on_head_node(self.cluster, "\n".join(commands))
        return {"Command": {"CommandId": command_id}}

    def get_command_invocation(self, *, CommandId, InstanceId):
        if CommandId not in self._results or InstanceId != self.head_node_id:
            raise InvocationDoesNotExist(CommandId)
        result = self._results[CommandId]
        return {
            "Status": "Success" if result.returncode == 0 else "Failed",
            "ResponseCode": result.returncode,
            "StandardOutputContent": result.stdout[:SSM_OUTPUT_CHARS],
            "StandardErrorContent": result.stderr[:SSM_OUTPUT_CHARS],
        }
