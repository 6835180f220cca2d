"""`preview` and `up` on a cluster stack: what the update needs, said before anything changes,
and done the ParallelCluster way when it needs the compute fleet stopped.

- A first create that failed is recovered first. The provider records the CloudFormation
  stack's id before it waits for the create (terraform-provider-aws, internal/service/
  cloudformation/stack.go, resourceStackCreate: d.SetId, then waitStackCreated, commit
  01606926a0c0ab9174aec440f976a48b0baee722), so Pulumi keeps the failed stack in its state
  (with init errors) while OnFailure DELETE has deleted it; the next `up` would update a stack
  that no longer exists. Reading it back (a refresh) drops a stack CloudFormation reports
  DELETE_COMPLETE or does not know (resourceStackRead, findStackByName), so `up` refreshes
  that one resource, and creates the cluster again.
- Pulumi's preview reports each step with the resource's old and new inputs (the Automation
  API's engine events, ResourcePreEvent): the cluster's CloudFormation template as deployed
  and as `up` will send it. ParallelCluster's own check says what the change needs
  (infra/cluster/update.py).
- A change that needs the fleet stopped: the jobs checkpoint and are held (`scontrol
  requeuehold`, as `stop` does), the fleet is stopped (STOP_REQUESTED, wait for STOPPED),
  Pulumi updates the cluster, the fleet is started (START_REQUESTED) and the jobs held here
  are released, also when the update fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.cluster.config import cloudformation_stack_name
from infra.cluster.control import parse_queue, release_script
from infra.cluster.update import UpdateNeed, UpdateVerdict, check_update, cluster_configuration
from infra.deployed import head_node, workspace
from infra.deployed.cluster_fleet import start_fleet, stop_fleet
from infra.errors import ConfigError
from infra.project import project_name, stack_resource_name

CLOUDFORMATION_STACK = "aws:cloudformation/stack:Stack"
# What the engine shows for a value it knows only during the update
# (pulumi/pulumi sdk/python/lib/pulumi/runtime/rpc.py, UNKNOWN).
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
# Steps that make the cluster's stack anew: its old cluster and running jobs go.
REPLACING = ("replace", "create-replacement", "delete-replaced")


def cluster_name(stack: str) -> str:
    """The Slurm cluster's name for stack `stack` (infra/components/cluster_stack.py)."""
    return stack_resource_name(project_name(), stack)


@dataclass
class ClusterStep:
    """Called with each engine event of a preview: keeps the cluster stack's step."""

    resource_name: str
    metadata: Any = None  # pulumi.automation.events.StepEventMetadata

    def __call__(self, event: Any) -> None:
        pre = getattr(event, "resource_pre_event", None)
        if (
            pre is not None
            and pre.metadata.type == CLOUDFORMATION_STACK
            and pre.metadata.urn.endswith(f"::{self.resource_name}")
        ):
            self.metadata = pre.metadata


@dataclass(frozen=True)
class PlannedChange:
    stack: str
    verdict: UpdateVerdict
    target: dict | None  # the cluster config `up` will send


def _op(metadata: Any) -> str:
    return getattr(metadata.op, "value", metadata.op)


def verdict_of(step: ClusterStep, stack: str) -> PlannedChange:
    """What the previewed step of the cluster's stack needs (ParallelCluster's check)."""
    metadata = step.metadata
    if metadata is None or _op(metadata) == "same":
        return PlannedChange(stack, UpdateVerdict(UpdateNeed.NONE), None)
    if _op(metadata) in REPLACING:
        reason = "Pulumi replaces the cluster's CloudFormation stack (its name or settings changed)"
        return PlannedChange(stack, UpdateVerdict(UpdateNeed.REPLACEMENT, (), (reason,)), None)
    body = (metadata.new.inputs or {}).get("templateBody") if metadata.new else None
    if not isinstance(body, str) or body == UNKNOWN:
        raise ConfigError(
            f"the new configuration of {stack}'s cluster depends on a value Pulumi learns only "
            "during the update, so ParallelCluster's update check cannot read it; nothing was "
            "changed: apply the other changes first (`pulumi up --target`), then this"
        )
    old = metadata.old.inputs.get("templateBody") if metadata.old else None
    base = cluster_configuration(old) if old else None
    target = cluster_configuration(body)
    return PlannedChange(stack, check_update(cluster_name(stack), base, target), target)


def recover_failed_create(stack: Any, name: str, *, say: Callable[[str], None]) -> None:
    """Refresh the cluster's CloudFormation stack in Pulumi's state when its create failed
    (init errors) or CloudFormation has deleted it, so this `up` creates it again."""
    resource_name = cloudformation_stack_name(cluster_name(name))
    resources = stack.export_stack().deployment.get("resources", [])
    for resource in resources:
        if resource.get("type") != CLOUDFORMATION_STACK or not resource.get("urn", "").endswith(
            f"::{resource_name}"
        ):
            continue
        failed = bool(resource.get("initErrors"))
        if not failed and not _gone(name, resource.get("id"), stack):
            return
        say(
            f"the cluster's CloudFormation stack {resource_name} "
            f"{'did not finish its create' if failed else 'is gone'}: reading it back, so "
            "that this up creates it again"
        )
        stack.refresh(target=[resource["urn"]], on_output=say, color="never")
        return


def _gone(name: str, stack_id: str | None, stack: Any) -> bool:
    """Whether CloudFormation no longer has the stack (DELETE_COMPLETE, or unknown)."""
    if not stack_id:
        return False
    from botocore.exceptions import ClientError

    cloudformation = workspace.aws("cloudformation", workspace.stack_region(stack, name))
    try:
        (found,) = cloudformation.describe_stacks(StackName=stack_id)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return True
        raise
    return found["StackStatus"] == "DELETE_COMPLETE"


def plan(
    stack: Any, name: str, *, say: Callable[[str], None], policy_packs: list[str]
) -> tuple[Any, PlannedChange]:
    """Recover a failed create, preview, and say what the cluster's update needs: (Pulumi's
    preview result, the planned change)."""
    recover_failed_create(stack, name, say=say)
    step = ClusterStep(cloudformation_stack_name(cluster_name(name)))
    result = stack.preview(on_output=say, on_event=step, color="never", policy_packs=policy_packs)
    change = verdict_of(step, name)
    say(change.verdict.line())
    return result, change


def apply(
    change: PlannedChange,
    stack: Any,
    update: Callable[[], Any],
    *,
    say: Callable[[str], None],
    sleep: Callable[[float], None],
) -> Any:
    """Run `update` (Pulumi's up), the fleet stopped around it when the change needs it."""
    if change.verdict.need is UpdateNeed.REPLACEMENT:
        raise ConfigError(change.verdict.line())
    if change.verdict.need is not UpdateNeed.FLEET_STOP:
        return update()
    deployed = workspace.deployed(change.stack, stack)
    state = head_node.head_node_state(deployed)
    if state != "running":
        raise ConfigError(
            f"this update needs the compute fleet stopped, which the head node does, and the "
            f"head node of {change.stack} is {state}: `python -m infra start {change.stack}`, "
            "then this again; nothing was changed"
        )
    held = [job for job in head_node.hold_queue(deployed, say=say, sleep=sleep) if job.held]
    stop_fleet(deployed, say=say, sleep=sleep)
    try:
        return update()
    finally:
        start_fleet(deployed, say=say, sleep=sleep)
        _release(deployed, held, change.target, say=say, sleep=sleep)


def _release(deployed, held, target: dict | None, *, say, sleep) -> None:
    """Release the jobs this update held; name those the new queue cannot run."""
    if not held:
        return
    released = parse_queue(
        head_node.on_head_node(
            deployed,
            release_script(only=tuple(job.id for job in held)),
            what="release the jobs held for the update",
            timeout_s=head_node.QUEUE_TIMEOUT_S,
            sleep=sleep,
        )
    )
    say(f"released {len(released)} job(s) held for the update: they resume from their checkpoints")
    most = _max_nodes(target)
    for job in released:
        if most is not None and job.nodes > most:
            say(
                f"job {job.id} ({job.name}) asks for {job.nodes} nodes and the queue now has "
                f"at most {most}: it waits forever; cancel it and run it again on {most}"
            )


def _max_nodes(target: dict | None) -> int | None:
    if not target:
        return None
    queues = target.get("Scheduling", {}).get("SlurmQueues", [])
    return sum(r.get("MaxCount", 0) for q in queues for r in q.get("ComputeResources", []))
