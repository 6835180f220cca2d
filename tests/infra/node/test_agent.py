import json

from infra.node.agent import (
    GPU_METRIC_DIMENSION,
    GPU_METRIC_NAMESPACE,
    GPU_UTILIZATION_METRIC,
    agent_policy_statement,
    cloudwatch_agent_config,
)


def test_agent_publishes_the_metric_the_idle_alarm_reads():
    config = json.loads(cloudwatch_agent_config())
    metrics = config["metrics"]
    assert metrics["namespace"] == GPU_METRIC_NAMESPACE
    # The agent names nvidia_gpu measurements "nvidia_smi_<measurement>".
    measurements = metrics["metrics_collected"]["nvidia_gpu"]["measurement"]
    assert GPU_UTILIZATION_METRIC in {f"nvidia_smi_{name}" for name in measurements}
    # One series per instance (InstanceId only), the alarm's single dimension.
    assert metrics["append_dimensions"] == {GPU_METRIC_DIMENSION: "${aws:InstanceId}"}
    assert metrics["aggregation_dimensions"] == [[GPU_METRIC_DIMENSION]]
    # Published every minute: the alarm's 5-minute periods always hold samples.
    assert metrics["metrics_collected"]["nvidia_gpu"]["metrics_collection_interval"] == 60


def test_namespace_is_configurable_and_the_policy_follows_it():
    assert json.loads(cloudwatch_agent_config("Team/Gpu"))["metrics"]["namespace"] == "Team/Gpu"
    statement = agent_policy_statement("Team/Gpu")
    assert statement["Action"] == "cloudwatch:PutMetricData"
    assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": "Team/Gpu"}}
