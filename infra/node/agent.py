"""The GPU metric the idle alarm watches, and the CloudWatch agent config that publishes it.

The boot script writes `cloudwatch_agent_config()` to the agent's config file and starts the agent;
the idle alarm (infra.components.guardrails) reads the same namespace, metric and dimension,
so both sides take them from here. Embed the JSON with a quoted heredoc (<<'EOF') or cloud-init
write_files: `${aws:InstanceId}` is the agent's placeholder, not a shell variable.
"""

from __future__ import annotations

import json
from typing import Any

GPU_METRIC_NAMESPACE = "GpuTrainingStack"
# The agent's nvidia_gpu plugin publishes utilization_gpu under this name (CloudWatch agent guide,
# "Collect NVIDIA GPU metrics"): percent of the last sample period a kernel ran on the GPU.
GPU_UTILIZATION_METRIC = "nvidia_smi_utilization_gpu"
GPU_METRIC_DIMENSION = "InstanceId"
AGENT_INTERVAL_SECONDS = 60


def cloudwatch_agent_config(namespace: str = GPU_METRIC_NAMESPACE) -> str:
    """The CloudWatch agent's JSON config: every GPU's use and memory, once a minute.

    `aggregation_dimensions` adds one series per instance (dimension InstanceId only) that folds
    all of its GPUs together: the idle alarm reads its Maximum, so one busy GPU keeps the instance
    up. The per-GPU series stay for dashboards. Each series is a custom metric ($0.30/month).
    """
    config: dict[str, Any] = {
        "agent": {"metrics_collection_interval": AGENT_INTERVAL_SECONDS},
        "metrics": {
            "namespace": namespace,
            "append_dimensions": {GPU_METRIC_DIMENSION: "${aws:InstanceId}"},
            "aggregation_dimensions": [[GPU_METRIC_DIMENSION]],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": ["utilization_gpu", "memory_used"],
                    "metrics_collection_interval": AGENT_INTERVAL_SECONDS,
                },
            },
        },
    }
    return json.dumps(config, indent=2, sort_keys=True)


def agent_policy_statement(namespace: str = GPU_METRIC_NAMESPACE) -> dict[str, Any]:
    """The IAM statement the instance role needs for the agent to publish into `namespace` only."""
    return {
        "Effect": "Allow",
        "Action": "cloudwatch:PutMetricData",
        "Resource": "*",  # PutMetricData has no resource-level permissions; the condition scopes it
        "Condition": {"StringEquals": {"cloudwatch:namespace": namespace}},
    }
