"""A simulated stack on moto's EC2: instances started, stopped, interrupted and replaced on a
simulated clock, with the running intervals written down as they happen.

moto stamps launch and stop times with the real clock; EC2 stamps them with the time they
happen. So after each action the world sets moto's record of the instance to the simulated time,
as EC2 would: `LaunchTime` on every start, a dated `StateTransitionReason` on a user's stop or
termination, an undated one on a spot interruption (EC2 dates only user-initiated changes).
The expected spend is summed from these intervals, never from the guard's code: each instance's
running time at its price, its public IPv4 address while it runs, and its root volume from
launch to termination (moto gives every instance an 8 GiB gp2 one, deleted with it, and a
public address in the default subnet, released on a stop, as EC2 does).
"""

from __future__ import annotations

import calendar
import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError
from moto.ec2.models import ec2_backends

from infra.functions.settings import GuardSettings
from infra.functions.spend_guard import NODE_TYPE_TAG, Outcome, run_guard
from tests.support.aws import ACCOUNT, REGION, an_image

COST_TAG = ("gpu-stack", "gpu-training-stack-test")
HEAD_NODE_TYPE = "m5.xlarge"
PRICES = {
    "p4d.24xlarge": {"on-demand": 32.7726, "spot": 9.9, "capacity-block": 14.75},
    HEAD_NODE_TYPE: {"on-demand": 0.192},
}
SCHEDULE = datetime.timedelta(minutes=5)
# Amazon EBS pricing, us-east-1 (aws.amazon.com/ebs/pricing/): gp2 $0.10 per GB-month, by the
# second of the calendar month; a public IPv4 address $0.005 an hour
# (aws.amazon.com/blogs/aws/new-aws-public-ipv4-address-charge-public-ip-insights/).
ROOT_VOLUME_GIB = 8
GP2_USD_PER_GB_MONTH = 0.10
PUBLIC_IPV4_USD_PER_HOUR = 0.005
# The rest of that page's us-east-1 table, per GB-month.
EBS_USD_PER_GB_MONTH = {
    "gp3": 0.08,
    "gp2": GP2_USD_PER_GB_MONTH,
    "io1": 0.125,
    "io2": 0.125,
    "st1": 0.045,
    "sc1": 0.015,
    "standard": 0.05,
}


def root_volume_hourly(days_in_month: int) -> float:
    """$/h of one moto root volume in a month of that many days."""
    return ROOT_VOLUME_GIB * GP2_USD_PER_GB_MONTH / (days_in_month * 24)


THRESHOLDS = (50.0, 80.0, 100.0)


def settings(topic_arn: str, budget: float, prices=PRICES, **extra: str) -> GuardSettings:
    return GuardSettings(
        table="ledger",
        topic_arn=topic_arn,
        cost_tag=COST_TAG,
        budget_usd=budget,
        budget_period="MONTHLY",
        thresholds_percent=THRESHOLDS,
        region="us-east-1",
        prices=prices,
        ebs_usd_per_gb_month=EBS_USD_PER_GB_MONTH,
        public_ipv4_usd_per_hour=PUBLIC_IPV4_USD_PER_HOUR,
        **extra,
    )


@dataclass
class Node:
    instance_id: str
    instance_type: str
    spot: bool
    tagged: bool
    capacity_block: bool = False
    addressed: bool = False  # EC2 gave it a public IPv4 address
    intervals: list[list[datetime.datetime | None]] = field(default_factory=list)
    volume_span: list[datetime.datetime | None] = field(default_factory=list)  # [created, deleted]

    @property
    def price(self) -> float:
        """$/h while it runs: nothing in a Capacity Block, paid when bought."""
        if self.capacity_block:
            return 0.0
        return PRICES[self.instance_type]["spot" if self.spot else "on-demand"]

    def running(self) -> bool:
        return bool(self.intervals) and self.intervals[-1][1] is None


class World:
    def __init__(self, ec2: Any, start: datetime.datetime) -> None:
        self.ec2 = ec2
        self.now = start
        self.nodes: dict[str, Node] = {}
        self.blocks: dict[str, dict[str, Any]] = {}  # Capacity Blocks bought, by id
        self.image_id = an_image(ec2)

    def advance(self, **delta: float) -> None:
        self.now += datetime.timedelta(**delta)

    def launch(
        self,
        instance_type: str = "p4d.24xlarge",
        *,
        spot: bool = False,
        tagged: bool = True,
        node_type: str = "",
        capacity_block: bool = False,
    ) -> str:
        """Start an instance; `node_type` tags it as ParallelCluster tags a cluster's nodes."""
        extra: dict[str, Any] = {}
        tags = [dict(zip(("Key", "Value"), COST_TAG, strict=True))] if tagged else []
        tags += [{"Key": NODE_TYPE_TAG, "Value": node_type}] if node_type else []
        if tags:
            extra["TagSpecifications"] = [{"ResourceType": "instance", "Tags": tags}]
        if spot:
            extra["InstanceMarketOptions"] = {"MarketType": "spot"}
        (instance,) = self.ec2.run_instances(
            ImageId=self.image_id, InstanceType=instance_type, MinCount=1, MaxCount=1, **extra
        )["Instances"]
        node = Node(
            instance["InstanceId"],
            instance_type,
            spot,
            tagged,
            capacity_block,
            addressed=bool(instance.get("PublicIpAddress")),
            volume_span=[self.now, None],
        )
        for mapping in instance["BlockDeviceMappings"]:
            ec2_backends[ACCOUNT][REGION].get_volume(
                mapping["Ebs"]["VolumeId"]
            ).create_time = self.now.replace(tzinfo=None)
        if capacity_block:  # moto has no Capacity Blocks: EC2 marks their instances so
            _record(node.instance_id).lifecycle = "capacity-block"
        self.nodes[node.instance_id] = node
        self._started(node)
        return node.instance_id

    def buy_block(self, block_id: str, instance_type: str, count: int, hours: float) -> None:
        """A Capacity Block from now for `hours`, as DescribeCapacityReservations gives it."""
        self.blocks[block_id] = {
            "CapacityReservationId": block_id,
            "InstanceType": instance_type,
            "TotalInstanceCount": count,
            "StartDate": self.now,
            "EndDate": self.now + datetime.timedelta(hours=hours),
            "ReservationType": "capacity-block",
        }

    def pending(self, instance_type: str = "p4d.24xlarge") -> str:
        """An instance launched that has not reached `running` yet (not billed yet)."""
        instance_id = self.launch(instance_type)
        node = self.nodes[instance_id]
        node.intervals.clear()
        record = _record(instance_id)
        record._state.name, record._state.code = "pending", 0
        return instance_id

    def run(self, instance_id: str) -> None:
        """The pending instance reaches `running`: billing starts."""
        record = _record(instance_id)
        record._state.name, record._state.code = "running", 16
        self._started(self.nodes[instance_id])

    def start(self, instance_id: str) -> None:
        self.ec2.start_instances(InstanceIds=[instance_id])
        self._started(self.nodes[instance_id])

    def stop(self, instance_id: str) -> None:
        self.ec2.stop_instances(InstanceIds=[instance_id])
        self._ended(self.nodes[instance_id], dated=True)

    def terminate(self, instance_id: str) -> None:
        self.ec2.terminate_instances(InstanceIds=[instance_id])
        self._ended(self.nodes[instance_id], dated=True)
        self.nodes[instance_id].volume_span[1] = self.now

    def interrupt(self, instance_id: str) -> None:
        """EC2 reclaims a spot instance: terminated, with no date in the reason."""
        self.ec2.terminate_instances(InstanceIds=[instance_id])
        self._ended(self.nodes[instance_id], dated=False)
        self.nodes[instance_id].volume_span[1] = self.now

    def sync(self) -> None:
        """Date the stops and terminations someone else (the guard) made since the last look."""
        for node in self.nodes.values():
            state = _record(node.instance_id)._state.name
            if node.running() and state != "running":
                self._ended(node, dated=True)
            if state == "terminated" and node.volume_span[1] is None:
                node.volume_span[1] = self.now

    def spend(self, *, tagged: bool = True) -> float:
        """$ the tagged instances ran up so far, from the intervals written down."""
        total = 0.0
        for node in self.nodes.values():
            if node.tagged != tagged:
                continue
            hourly = node.price + (PUBLIC_IPV4_USD_PER_HOUR if node.addressed else 0.0)
            for start, end in node.intervals:
                total += ((end or self.now) - start).total_seconds() / 3600 * hourly
            created, deleted = node.volume_span
            total += _root_volume_usd(created, deleted or self.now)
        return total

    def hourly(self) -> float:
        """$/h of the tagged instances now: running ones, and the volumes of any not ended."""
        days = calendar.monthrange(self.now.year, self.now.month)[1]
        return sum(
            (n.price + (PUBLIC_IPV4_USD_PER_HOUR if n.addressed else 0.0) if n.running() else 0.0)
            + (root_volume_hourly(days) if n.volume_span[1] is None else 0.0)
            for n in self.nodes.values()
            if n.tagged
        )

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


def guard(aws: dict[str, Any], world: World, config: GuardSettings, **clients: Any) -> Outcome:
    """One run of the guard at the world's time; `clients` replace moto's (faults)."""
    outcome = run_guard(
        config,
        ec2=clients.get("ec2", aws["ec2"]),
        dynamodb=clients.get("dynamodb", aws["dynamodb"]),
        sns=clients.get("sns", aws["sns"]),
        now=world.now,
        ssm=clients.get("ssm"),
        sleep=lambda seconds: None,
    )
    world.sync()
    return outcome


class Ec2:
    """moto's EC2 with what it lacks: EC2 refuses to stop a one-time spot instance (as
    ParallelCluster's spot nodes are), and describes the world's Capacity Blocks."""

    def __init__(self, ec2: Any, world: World) -> None:
        self._ec2, self._world = ec2, world

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ec2, name)

    def stop_instances(self, InstanceIds: list[str]) -> Any:
        if any(self._world.nodes[i].spot for i in InstanceIds if i in self._world.nodes):
            error = {"Error": {"Code": "UnsupportedOperation", "Message": "one-time spot"}}
            raise ClientError(error, "StopInstances")
        return self._ec2.stop_instances(InstanceIds=InstanceIds)

    def describe_capacity_reservations(self, CapacityReservationIds: list[str]) -> Any:
        return {"CapacityReservations": [self._world.blocks[i] for i in CapacityReservationIds]}


class Failing:
    """A client whose `operation` raises `code` while `failing` is true, as a throttled or
    unreachable service does; every other call goes through."""

    def __init__(self, client: Any, operation: str, code: str) -> None:
        self._client, self._operation, self._code = client, operation, code
        self.failing = True

    def __getattr__(self, name: str) -> Any:
        if name == self._operation and self.failing:
            return self._fail
        return getattr(self._client, name)

    def _fail(self, **_: Any) -> Any:
        raise ClientError({"Error": {"Code": self._code, "Message": "failing"}}, self._operation)


def _root_volume_usd(start: datetime.datetime, end: datetime.datetime) -> float:
    """One root volume from `start` to `end`, each calendar month at its own length."""
    total = 0.0
    while start < end:
        days = calendar.monthrange(start.year, start.month)[1]
        month_end = start.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        month_end += datetime.timedelta(days=days)
        upto = min(end, month_end)
        total += (upto - start).total_seconds() / 3600 * root_volume_hourly(days)
        start = upto
    return total


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
