"""The program reads each config namespace whole, as the Pulumi engine hands it over."""

from infra.components.stack_config import namespace_config, provider_settings
from infra.dryrun.runner import run_stack_file
from tests.support.mock_runs import of_type


def test_config_is_read_from_the_whole_namespace(monkeypatch):
    # The Pulumi language host hands the stack's config over in PULUMI_CONFIG.
    monkeypatch.setenv(
        "PULUMI_CONFIG", '{"gpu:nodes": "2", "gpu:spot": "true", "aws:region": "us-west-2"}'
    )
    assert namespace_config("gpu") == {"nodes": "2", "spot": "true"}
    assert namespace_config("aws") == {"region": "us-west-2"}


def test_aws_settings_become_provider_arguments():
    settings = provider_settings(
        {
            "profile": "research",
            "region": "eu-west-1",
            "assumeRoles": '[{"roleArn": "arn:aws:iam::210987654321:role/deploy"}]',
            "allowedAccountIds": '["210987654321"]',
            "s3UsEast1RegionalEndpoint": "regional",
            "defaultTags": '{"tags": {"team": "ml"}}',  # the stack adds its own
            "notAProviderSetting": "x",
        }
    )
    assert settings == {
        "profile": "research",
        "region": "eu-west-1",
        "assume_roles": [{"role_arn": "arn:aws:iam::210987654321:role/deploy"}],
        "allowed_account_ids": ["210987654321"],
        "s3_us_east1_regional_endpoint": "regional",
    }


def test_a_stack_file_naming_a_profile_deploys_through_it(tmp_path):
    stack = tmp_path / "Pulumi.research.yaml"
    stack.write_text(
        "config:\n  aws:region: us-west-2\n  aws:profile: research\n  gpu:profile: a100x8\n"
        "  gpu:budgetUsd: 1000\n  gpu:alertEmails: [ml@example.com]\n"
    )
    run = run_stack_file(stack)
    (provider,) = of_type(run, "pulumi:providers:aws")
    assert (provider.inputs["profile"], provider.inputs["region"]) == ("research", "us-west-2")
    # Every AWS resource is managed through that provider ("<provider urn>::<provider id>").
    uses = {resource.provider for resource in run.resources if resource.type.startswith("aws:")}
    assert len(uses) == 1
    (used,) = uses
    assert used.endswith(f"::{provider.name}::{provider.id}")
