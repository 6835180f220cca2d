"""The Epilog that drains a node for a job: templates/node-verdicts.epilog, rendered.

A node that fails the job's health gate must leave the queue, and the job must run elsewhere.
The job cannot drain it: only Slurm's super users (root, SlurmUser) may update a node
(SchedMD/slurm src/slurmctld/proc_req.c, _slurm_rpc_update_node and validate_super_user,
commit 284c3b95f08a2dc2478499837b03355e1b9c5c75), and a job runs as the user who submitted
it. Its owner may requeue it (job_mgr.c, _job_requeue_op: the job's user, an operator or an
account coordinator). So the job leaves its verdict on the node, in a file, and requeues
itself; the Epilog, which slurmd runs as root on every node of the job when the job leaves
it (slurm.conf(5), Epilog; "The Epilog ... always runs on every node of an allocation when
the allocation is released"), drains the node with the verdict as its reason. The node is
COMPLETING while the Epilog runs and takes no job until it ends (slurm.conf(5), Epilog and
CompleteWait), so the requeued job cannot land on it again.

Why not a Prolog, which Slurm itself drains a node for when it fails (slurm.conf(5),
Prolog; ParallelCluster sets nohold_on_prolog_fail so the job is requeued, not held)? The
gate runs in the job's image (python -m training health, with the image's CUDA, NCCL and
torch), and the image is on the node only once the job's first step has imported it:
after the Prolog.

The same Epilog drains a node whose instance has a spot interruption notice (IMDSv2
`/latest/meta-data/spot/instance-action`, 404 until EC2 plans to reclaim the instance:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html),
so a job that checkpointed on the notice and was requeued starts on another node, not on
the one EC2 ends two minutes later. ParallelCluster's clustermgtd terminates an idle drained
dynamic node and launches a fresh one when a job needs it (aws/aws-parallelcluster-node,
src/slurm_plugin/clustermgtd.py, terminate_drain_nodes, True by default, commit
47b9432445eab65eee35d34794340c0cb773ea36).

What slurmd gives an Epilog (SchedMD/slurm src/plugins/prep/script/prep_script_slurmd.c,
_build_env, tag slurm-22-05-8-1 and the commit above): SLURM_JOB_ID, SLURM_JOB_UID,
SLURMD_NODENAME, SLURM_CONF, and no PATH.
"""

from __future__ import annotations

import re
from pathlib import Path

from infra.cluster.config import NODE_VERDICTS_DIR
from infra.node.boot import ScriptTemplate

TEMPLATE = Path(__file__).parent / "templates" / "node-verdicts.epilog"
# A verdict's file in the node's verdict folder: the job and the node, as both the job's
# steps (slurmstepd sets them) and the Epilog (slurmd sets them) see them.
VERDICT_FILE = "${SLURM_JOB_ID}.${SLURMD_NODENAME}"
# The instance metadata service every EC2 instance reaches.
INSTANCE_METADATA = "http://169.254.169.254"
# Shell words the rendered values may hold: a path or URL, and a node's name in ${...}.
_SAFE = re.compile(r"[A-Za-z0-9_./:${}-]+")


def render_epilog(
    node_verdicts: str = NODE_VERDICTS_DIR, metadata_endpoint: str = INSTANCE_METADATA
) -> str:
    """The Epilog for nodes whose verdict folder is `node_verdicts` and whose instance
    metadata service is at `metadata_endpoint` (it may name the node, ${SLURMD_NODENAME}:
    the loopback cluster of the tests gives each node its own)."""
    for value in (node_verdicts, metadata_endpoint):
        if not _SAFE.fullmatch(value):
            raise ValueError(f"Epilog value {value!r} holds a character the script cannot quote")
    return ScriptTemplate(TEMPLATE.read_text()).substitute(
        node_verdicts=node_verdicts.rstrip("/"),
        verdict_file=VERDICT_FILE,
        metadata_endpoint=metadata_endpoint.rstrip("/"),
    )
