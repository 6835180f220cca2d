"""Generated training configs: always one clear ConfigError or a valid plan, never a traceback."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from training.spec.config import BatchSizes, Config, ConfigError, load_config, validate

# Every key of the schema, and a few that are not (typos, unknown sections).
KEYS = [
    f"{section}.{key}"
    for section, field in Config.model_fields.items()
    for key in field.annotation.model_fields
] + ["train.step", "model.presets", "zero.stages", "nosection.key", "train", "run.name.deep"]

# Values as TOML text (what `--set key=value` takes), of every kind a user might type.
VALUES = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.sampled_from(["0", "1", "2", "3", "8", "64", "256", "1000", "-1"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "yes", "'tiny'", "'gpt2'", "'bert-base'", "'cosine'"]),
    st.sampled_from(["'tokens'", "'text'", "'synthetic'", "'uint32'", "[0.9, 0.95]", "[1]"]),
    st.sampled_from(["{}", "{a = 1}", "'pkg.mod:build'", "'not an import'", "[", "'", ""]),
    st.text(max_size=12),
)
OVERRIDES = st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=8)


@settings(max_examples=400, deadline=None)
@given(overrides=OVERRIDES, world_size=st.integers(min_value=1, max_value=64))
def test_any_config_is_a_clear_error_or_a_valid_plan(overrides, world_size):
    items = [f"{key}={value}" for key, value in overrides]
    try:
        config = load_config(None, items, env={})
        plan = validate(config, world_size)
    except ConfigError as error:
        message = str(error)
        assert message and "\n" not in message and "Traceback" not in message
        return
    assert isinstance(plan, BatchSizes)
    assert (
        plan.global_batch_size
        == plan.micro_batch_size * plan.gradient_accumulation_steps * world_size
    )
    assert min(plan.micro_batch_size, plan.gradient_accumulation_steps) >= 1
