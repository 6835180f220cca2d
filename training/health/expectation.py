"""What the health gate expects of a node: the catalog's figures for its instance type.

The image carries no catalog (infra/knowledge/data stays outside it), so the boot script
and the Slurm batch script hand the figures over as TRAIN_EXPECT_* variables. Both sides
use this one definition: infra renders `to_env()`, the gate reads `from_env()`.
Torch-free, so infra imports it without the trainer's dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class ExpectationError(ValueError):
    """A TRAIN_EXPECT_* value that is not a number; str(error) names it and the fix."""


@dataclass(frozen=True)
class NodeExpectation:
    """None: not known, that check only reports what it measured."""

    gpus: int | None = None
    gpu_model: str | None = None  # a part of NVML's name: "A100" in "NVIDIA A100-SXM4-40GB"
    busbw_gbps: float | None = None  # all-reduce bus bandwidth across the node's GPUs
    efa_devices: int | None = None
    # all-reduce bus bandwidth across every GPU of several such nodes (python -m training fabric)
    fabric_busbw_gbps: float | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            "TRAIN_EXPECT_GPUS": self.gpus,
            "TRAIN_EXPECT_GPU_MODEL": self.gpu_model,
            "TRAIN_EXPECT_BUSBW_GBPS": self.busbw_gbps,
            "TRAIN_EXPECT_EFA": self.efa_devices,
            "TRAIN_EXPECT_FABRIC_BUSBW_GBPS": self.fabric_busbw_gbps,
        }
        return {name: str(value) for name, value in env.items() if value is not None}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeExpectation:
        return cls(
            gpus=_number(env, "TRAIN_EXPECT_GPUS", int),
            gpu_model=env.get("TRAIN_EXPECT_GPU_MODEL") or None,
            busbw_gbps=_number(env, "TRAIN_EXPECT_BUSBW_GBPS", float),
            efa_devices=_number(env, "TRAIN_EXPECT_EFA", int),
            fabric_busbw_gbps=_number(env, "TRAIN_EXPECT_FABRIC_BUSBW_GBPS", float),
        )


def _number(env: Mapping[str, str], name: str, kind: type[int] | type[float]):
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not value >= 0:
        raise ExpectationError(
            f"{name} = {text!r} is not a {'count' if kind is int else 'figure'}: give a "
            f"{'whole ' if kind is int else ''}number of at least 0, or leave it unset"
        )
    return value
