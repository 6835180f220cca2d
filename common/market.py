"""How a stack's instances are bought: one vocabulary for the plan, the budget check, the
spend guard, offers and status. Standard library only: the spend guard's Lambda imports it
(infra/components/spend_guard.py LAMBDA_SHARED carries it into the archive).
"""

from __future__ import annotations

from enum import StrEnum


class Market(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    # Paid up front for fixed dates ("Capacity Blocks for ML", docs.aws.amazon.com/AWSEC2/
    # latest/UserGuide/ec2-capacity-blocks.html); EC2 sets InstanceLifecycle to this value.
    CAPACITY_BLOCK = "capacity-block"
    # An On-Demand Capacity Reservation: billed at the on-demand rate while it exists
    # ("Capacity Reservation pricing and billing", docs.aws.amazon.com/AWSEC2/latest/
    # UserGuide/capacity-reservations-pricing-billing.html); its instances are on-demand ones.
    RESERVATION = "reservation"


# The markets prices.toml and the spend guard's price table name: a reservation is priced
# as on-demand.
PRICED_MARKETS = (Market.ON_DEMAND, Market.SPOT, Market.CAPACITY_BLOCK)
