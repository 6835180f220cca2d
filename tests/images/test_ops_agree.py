"""Every DeepSpeed op a job file can switch on is pre-built in the image that runs it.

The job's settings that pick an op are the ZeRO stage, its offloads and the precision
(training/spec/config.py refuses any other key); the trainer names the op each
combination loads (training/spec/ops.py). The runtime stage has no compiler, so an op
missing from the variant's [deepspeed_ops] would stop the job at start.
"""

import itertools

import pytest

from images.matrix import load_matrix
from training.spec.config import Config, ConfigError, load_config, validate
from training.spec.ops import ops_needed

MATRIX = load_matrix()


def every_job_setting():
    """Each combination of the settings that decide which ops load, that the trainer accepts."""
    for stage, offload_optimizer, offload_param, precision in itertools.product(
        range(4), (False, True), (False, True), ("fp32", "bf16", "fp16")
    ):
        overrides = [
            f"zero.stage={stage}",
            f"zero.offload_optimizer={str(offload_optimizer).lower()}",
            f"zero.offload_param={str(offload_param).lower()}",
        ]
        if precision != "fp32":
            overrides.append(f"precision.{precision}=true")
        config = load_config(None, overrides)
        try:
            validate(config, world_size=2)
        except ConfigError:
            continue  # refused before start: no op is ever loaded for it
        yield config


SETTINGS: list[Config] = list(every_job_setting())


def test_the_settings_cover_offload_and_no_offload():
    assert any(c.zero.offload_optimizer for c in SETTINGS)
    assert any(not c.zero.offload_optimizer for c in SETTINGS)


@pytest.mark.parametrize("variant", MATRIX.variants, ids=lambda v: v.name)
def test_every_op_a_setting_loads_is_pre_built_in_the_image(variant):
    prebuilt = set(MATRIX.ops(variant).values())
    on_gpu = variant.cuda is not None
    for config in SETTINGS:
        needed = set(ops_needed(config, on_gpu=on_gpu))
        assert needed <= prebuilt, (variant.name, config.zero, needed - prebuilt)
