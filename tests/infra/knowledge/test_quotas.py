"""Every catalog type launches under a recorded EC2 quota, in both markets."""

import pytest

from infra.errors import ConfigError
from infra.knowledge.catalog import load_catalog
from infra.knowledge.quotas import quota_for


@pytest.mark.parametrize("instance_type", sorted(load_catalog().instances))
@pytest.mark.parametrize("spot", [False, True])
def test_every_catalog_type_has_a_quota(instance_type, spot):
    quota = quota_for(instance_type, spot=spot)
    assert ("Spot Instance Requests" in quota.name) == spot
    assert quota.code is None or quota.code.startswith("L-")


def test_p5_spot_has_its_own_quota_and_g_on_demand_its_code():
    assert quota_for("p5.48xlarge", spot=True).name == "All P5 Spot Instance Requests"
    assert quota_for("p4d.24xlarge", spot=True).name != quota_for("p5.48xlarge", spot=True).name
    assert quota_for("g6e.12xlarge", spot=False).code == "L-DB2E81BA"


def test_unknown_family_names_the_file():
    with pytest.raises(ConfigError, match="no EC2 quota recorded for the trn1 family"):
        quota_for("trn1.32xlarge", spot=False)
