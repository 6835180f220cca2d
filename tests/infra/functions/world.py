"""A simulated stack on moto's EC2: instances started, stopped, interrupted and replaced on a
simulated clock, with the running intervals written down as they happen.

moto stamps launch and stop times with the real clock; EC2 stamps them with the time they
happen. So after each action the world sets moto's record of the instance to the simulated time,
as EC2 would: `LaunchTime` on every start, a dated `StateTransitionReason` on a user's stop or
termination, an undated one on a spot interruption (EC2 dates only user-initiated changes).
The expected spend is summed from these intervals, never from the guard's code.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from moto.ec2.models import ec2_backends

from tests.support.aws import ACCOUNT, REGION

COST_TAG = ("gpu-stack", "gpu-training-stack-test")
PRICES = {"p4d.24xlarge": {"on-demand": 32.7726, "spot": 9.9}}


@dataclass
class Node:
    instance_id: str
    instance_type: str
    spot: bool
    tagged: bool
    intervals: list[list[datetime.datetime | None]] = field(default_factory=list)

    @property
    def price(self) -> float:
        return PRICES[self.instance_type]["spot" if self.spot else "on-demand"]

    def running(self) -> bool:
        return bool(self.intervals) and self.intervals[-1][1] is None


class World:
    def __init__(self, ec2: Any, start: datetime.datetime) -> None:
        self.ec2 = ec2
        self.now = start
        self.nodes: dict[str, Node] = {}
        self.image_id = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

    def advance(self, **delta: float) -> None:
        self.now += datetime.timedelta(**delta)

    def launch(
        self, instance_type: str = "p4d.24xlarge", *, spot: bool = False, tagged: bool = True
    ) -> str:
        extra: dict[str, Any] = {}
        if tagged:
            key, value = COST_TAG
            extra["TagSpecifications"] = [
                {"ResourceType": "instance", "Tags": [{"Key": key, "Value": value}]}
            ]
        if spot:
            extra["InstanceMarketOptions"] = {"MarketType": "spot"}
        (instance,) = self.ec2.run_instances(
            ImageId=self.image_id, InstanceType=instance_type, MinCount=1, MaxCount=1, **extra
        )["Instances"]
        node = Node(instance["InstanceId"], instance_type, spot, tagged)
        self.nodes[node.instance_id] = node
        self._started(node)
        return node.instance_id

    def start(self, instance_id: str) -> None:
        self.ec2.start_instances(InstanceIds=[instance_id])
        self._started(self.nodes[instance_id])

    def stop(self, instance_id: str) -> None:
        self.ec2.stop_instances(InstanceIds=[instance_id])
        self._ended(self.nodes[instance_id], dated=True)

    def terminate(self, instance_id: str) -> None:
        self.ec2.terminate_instances(InstanceIds=[instance_id])
        self._ended(self.nodes[instance_id], dated=True)

    def interrupt(self, instance_id: str) -> None:
        """EC2 reclaims a spot instance: terminated, with no date in the reason."""
        self.ec2.terminate_instances(InstanceIds=[instance_id])
        self._ended(self.nodes[instance_id], dated=False)

    def sync(self) -> None:
        """Date the stops someone else (the guard) made since the last look."""
        for node in self.nodes.values():
            if node.running() and _record(node.instance_id)._state.name != "running":
                self._ended(node, dated=True)

    def spend(self, *, tagged: bool = True) -> float:
        """$ the tagged instances ran up so far, from the intervals written down."""
        total = 0.0
        for node in self.nodes.values():
            if node.tagged != tagged:
                continue
            for start, end in node.intervals:
                total += ((end or self.now) - start).total_seconds() / 3600 * node.price
        return total

    def hourly(self) -> float:
        """$/h of the tagged instances running now."""
        return sum(n.price for n in self.nodes.values() if n.tagged and n.running())

    def running_ids(self, *, tagged: bool = True) -> set[str]:
        return {i for i, n in self.nodes.items() if n.tagged == tagged and n.running()}

    def _started(self, node: Node) -> None:
        _record(node.instance_id).launch_time = self.now.replace(tzinfo=None)
        node.intervals.append([self.now, None])

    def _ended(self, node: Node, *, dated: bool) -> None:
        record = _record(node.instance_id)
        stamp = self.now.strftime("%Y-%m-%d %H:%M:%S")
        record._reason = f"User initiated ({stamp} GMT)" if dated else "Service initiated"
        node.intervals[-1][1] = self.now


def _record(instance_id: str) -> Any:
    return ec2_backends[ACCOUNT][REGION].get_instance(instance_id)


def notices(sqs: Any, queue_url: str) -> list[str]:
    """Subjects of every SNS notice delivered to the queue so far (and drains it)."""
    subjects = []
    while True:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get(
            "Messages", []
        )
        if not messages:
            return subjects
        for message in messages:
            subjects.append(json.loads(message["Body"])["Subject"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
