"""The program reads each config namespace whole, as the Pulumi engine hands it over."""

import pulumi

from infra.components.stack_config import namespace_config


def test_config_is_read_from_the_whole_namespace(monkeypatch):
    # The Pulumi language host hands the stack's config over in PULUMI_CONFIG.
    monkeypatch.setenv("PULUMI_CONFIG", '{"gpu:nodes": "2", "aws:region": "us-west-2"}')
    pulumi.runtime.set_all_config({"gpu:spot": "true"})
    try:
        assert namespace_config("gpu") == {"nodes": "2", "spot": "true"}
    finally:
        pulumi.runtime.set_all_config({})
