"""Per-instance all-reduce bus bandwidth (data/allreduce.toml), and what the health gate
expects of a node of a given type.

The gate runs inside the image, which carries no catalog: the boot script and the Slurm
batch script hand it `node_expectation(...)` as TRAIN_EXPECT_* variables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StrictFloat, model_validator

from common.records import DataFile, record
from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, Instance, load_catalog
from training.health.expectation import NodeExpectation

ALLREDUCE_FILE = CATALOG_DIR / "allreduce.toml"


@record
class AllReduceSources:
    busbw_gbps: str
    fabric_busbw_gbps: str | None = None


@record
class AllReduceFigure:
    busbw_gbps: Annotated[StrictFloat, Field(gt=0)]
    basis: Literal["measured", "derived"]
    sources: AllReduceSources
    # Across two such nodes over EFA (python -m training fabric); only where a run was found.
    fabric_busbw_gbps: Annotated[StrictFloat, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _fabric_figure_has_a_source(self) -> AllReduceFigure:
        if self.fabric_busbw_gbps is not None and not self.sources.fabric_busbw_gbps:
            raise ValueError(
                "fabric_busbw_gbps needs sources.fabric_busbw_gbps: where it was measured"
            )
        return self


def load_allreduce(
    instances: dict[str, Instance], path: Path = ALLREDUCE_FILE
) -> dict[str, AllReduceFigure]:
    """The figures by instance type; every type with more than one GPU must have one."""
    file = DataFile.read(path, {"allreduce"}, ConfigError)
    figures = file.tables(AllReduceFigure, "allreduce")
    for name in figures:
        if name not in instances:
            raise ConfigError(
                f"{file.where('allreduce', name)}: not an instance type in instances.toml"
            )
    missing = sorted(name for name, entry in instances.items() if entry.gpu_count > 1)
    missing = [name for name in missing if name not in figures]
    if missing:
        raise file.fail(
            f"no all-reduce figure for {', '.join(missing)}: every instance type "
            "with more than one GPU needs one, with its source"
        )
    return figures


def node_expectation(
    instance: Instance,
    *,
    efa_attached: bool,
    figures: dict[str, AllReduceFigure] | None = None,
) -> NodeExpectation:
    """What the gate checks on a node of this type; EFA, and the bandwidth between nodes
    over it, only where the stack attaches it.

    `figures` defaults to data/allreduce.toml, checked against the whole catalog."""
    if figures is None:
        figures = load_allreduce(load_catalog().instances)
    figure = figures.get(instance.type)
    return NodeExpectation(
        gpus=instance.gpu_count,
        gpu_model=instance.gpu_model,
        busbw_gbps=figure.busbw_gbps if figure is not None else None,
        efa_devices=instance.efa_interfaces if efa_attached else None,
        fabric_busbw_gbps=figure.fabric_busbw_gbps if figure and efa_attached else None,
    )
