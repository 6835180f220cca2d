"""Generated `gpu:` stack configs: always one clear ConfigError or a valid plan, never a
traceback. The checks are the ones the Pulumi program runs before any resource
(__main__.py): load the keys, resolve and price the plan for the region, check it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from infra.config.guardrails import MAX_BUDGET_USD, GuardrailConfig
from infra.config.schema import load_stack_config, own_keys, stack_region
from infra.config.stack_file import load_stack_file, stack_file_region
from infra.errors import ConfigError
from infra.knowledge.costs import cost_summary
from infra.knowledge.profiles import load_profiles
from infra.knowledge.resolver import MAX_NODES, Plan
from infra.planning import check_plan, resolve_plan

KEYS = sorted({*own_keys(), *GuardrailConfig.config_keys()} - {"trainConfig"})
TYPOS = ["profil", "budgetUSD", "spot ", "gpu:spot", "nodes.count", ""]

# Values as the Pulumi CLI hands them over: strings, structured values as JSON text.
VALUES = st.one_of(
    st.sampled_from([*sorted(load_profiles().profiles), "a100x3", "slurm", "auto"]),
    st.sampled_from(["p4d.24xlarge", "p3.2xlarge", "g5.xlarge", "p9.huge", "cu128", "cu130"]),
    st.sampled_from(["true", "false", "yes", "on", "True", "0", "1", "2", "16", "-1", "1e3"]),
    st.sampled_from(["500", "0.5", "100000", "30", "5", "0", "nan", "inf", "24", "0.25"]),
    st.sampled_from(["us-east-1a", "s3://data-bucket/prefix", "s3://Bad", "10.0.0.0/8", "0/0"]),
    st.lists(st.sampled_from(["ml@team.dev", "you@example.com", "not-an-address", ""])).map(
        json.dumps
    ),
    st.lists(st.floats(allow_nan=True, allow_infinity=True)).map(json.dumps),
    st.text(max_size=16),
)
# Values a user would likely give each key, so that many generated stacks are valid too.
LIKELY = {
    "profile": sorted(load_profiles().profiles),
    "instanceType": ["p4d.24xlarge", "p3.2xlarge", "g5.xlarge", "g6e.12xlarge"],
    "imageVariant": ["auto", "cu128", "cu130"],
    "nodes": ["1", "2", "4"],
    "cluster": ["slurm"],
    "spot": ["true", "false"],
    "budgetUsd": ["500", "5000", "50000"],
    "idleMinutes": ["30", "60"],
    "maxRuntimeHours": ["8", "24", "72"],
    "rootVolumeGiB": ["200", "500"],
    "logRetentionDays": ["7", "30"],
}


def value_for(key: str) -> st.SearchStrategy[str]:
    likely = LIKELY.get(key)
    # Drawn first, so hypothesis tries a likely value more often than an arbitrary one.
    return st.one_of(st.sampled_from(likely), VALUES) if likely else VALUES


# A misspelt key is one draw in six or so: every stack with one fails the same way.
CONFIGS = st.lists(st.sampled_from(KEYS * 4 + TYPOS), max_size=4, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({key: value_for(key) for key in keys})
)
REGIONS = st.sampled_from(["us-east-1", "us-west-2", "eu-west-1", "eu-west-3", "mars-north-1"])


@settings(max_examples=500, deadline=None)
@given(raw=CONFIGS, region=REGIONS)
def test_any_stack_config_is_a_clear_error_or_a_valid_plan(raw, region):
    raw = {"alertEmails": '["ml@team.dev"]', "budgetUsd": "5000", **raw}
    try:
        config = load_stack_config(raw)
        plan = resolve_plan(config, region)
        check_plan(config, plan)
    except ConfigError as error:
        message = str(error)
        assert message and "\n" not in message and "Traceback" not in message
        return
    assert isinstance(plan, Plan)
    assert plan.nodes >= 1 and plan.gpus == plan.nodes * plan.instance.gpu_count
    assert plan.nodes == 1 or config.cluster is not None  # more than one node: the cluster


# Stack files as a person writes them: gpu: keys, a few aws: ones, a key given twice, a key in
# a namespace nothing reads, and numbers far out of range.
FILE_KEYS = [f"gpu:{key}" for key in KEYS] + [
    "aws:region",
    "aws:regoin",
    "gpus:budgetUsd",
    "budgetUsd",
    "gpu-training-stack:nodes",
]
OUT_OF_RANGE = st.sampled_from(["1e12", "100000", "1000001", "-5", "257", "99999999"])
FILE_VALUES = {
    "aws:region": st.sampled_from(["us-east-1", "us-west-2", "eu-west-1", "mars-north-1"]),
    "gpu:budgetUsd": st.one_of(st.sampled_from(LIKELY["budgetUsd"]), OUT_OF_RANGE),
    "gpu:nodes": st.one_of(st.sampled_from(LIKELY["nodes"]), OUT_OF_RANGE),
}
ENTRIES = st.lists(
    st.sampled_from(FILE_KEYS).flatmap(
        lambda key: st.tuples(st.just(key), FILE_VALUES.get(key, value_for(key.split(":")[-1])))
    ),
    max_size=6,
)


def _stack_file_text(entries: list[tuple[str, str]]) -> str:
    lines = ["config:", "  gpu:alertEmails: [ml@team.dev]"]
    # A JSON string is a YAML double-quoted scalar: every value reaches the loader as written.
    lines += [f"  {key}: {json.dumps(value)}" for key, value in entries]
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None)
@given(entries=ENTRIES)
def test_any_stack_file_is_a_clear_error_or_a_plan_within_every_limit(entries):
    keys = [key for key, _ in entries]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "Pulumi.generated.yaml"
        path.write_text(_stack_file_text(entries))
        try:
            config = load_stack_file(path)
            plan = resolve_plan(config, stack_region(stack_file_region(path)))
            check_plan(config, plan)
        except ConfigError as error:
            message = str(error)
            assert message and "\n" not in message
            duplicated = sorted({key for key in keys if keys.count(key) > 1})
            if duplicated:  # the first thing refused, before any value is read
                assert "is given twice" in message
            return
    # Nothing was silently accepted: no key twice, none unread, every number in range.
    assert len(set(keys)) == len(keys)
    assert all(key.split(":")[0] in ("gpu", "aws") and key != "aws:regoin" for key in keys)
    assert 0 < config.guardrails.budget_usd <= MAX_BUDGET_USD
    assert 1 <= plan.nodes <= MAX_NODES
    costs = cost_summary(plan, config.guardrails, market=config.market)
    period_hours = 24 if config.guardrails.budget_period == "DAILY" else 365 / 12 * 24
    assert 0 < costs.runway_hours <= round(period_hours, 1)
