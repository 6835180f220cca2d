"""`python -m training export CHECKPOINT out.pt`: full fp32 weights from a checkpoint.

CHECKPOINT is a checkpoint root (the newest committed step is taken) or one step folder
(`<root>/step_00001000`). The result is a plain `state_dict` for `model.load_state_dict`,
with no DeepSpeed needed to read it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from training.checkpoint.layout import COMMIT_MARKER, POINTER_NAME


class ExportError(Exception):
    """The path holds no committed checkpoint; str(error) is the one-line reason."""


def locate(path: Path) -> tuple[Path, str]:
    """(checkpoint root, tag) of a step folder, or of a root's newest committed step."""
    if (path / COMMIT_MARKER).is_file():
        return path.parent, path.name
    pointer = path / POINTER_NAME
    if pointer.is_file():
        tag = pointer.read_text().strip()
        if (path / tag / COMMIT_MARKER).is_file():
            return path, tag
        raise ExportError(f"{pointer} names {tag}, which is not a committed checkpoint")
    raise ExportError(
        f"{path} is not a committed checkpoint: expected a step folder with {COMMIT_MARKER} "
        f"or a checkpoint root with {POINTER_NAME}"
    )


def fp32_state_dict(root: Path, tag: str) -> dict[str, torch.Tensor]:
    record = json.loads((root / tag / COMMIT_MARKER).read_text())
    if record["zero_stage"] == 0:
        # Without ZeRO the model file holds every weight (in the training dtype).
        states = torch.load(
            root / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
        )
        return {name: tensor.float() for name, tensor in states["module"].items()}
    # ZeRO 1-3: rebuild full fp32 weights from the optimizer's partitioned master copy.
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag)


def export(checkpoint: Path, out: Path) -> tuple[str, int]:
    """Write the weights to `out`; return the tag exported and the number of parameters."""
    root, tag = locate(checkpoint)
    state = fp32_state_dict(root, tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    unique = {tensor.data_ptr(): tensor.numel() for tensor in state.values()}
    return tag, sum(unique.values())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training export",
        description="Write a checkpoint's full fp32 weights as a plain PyTorch state_dict.",
    )
    p.add_argument("checkpoint", type=Path, help="checkpoint root or one step_NNNNNNNN folder")
    p.add_argument("out", type=Path, help="output file, e.g. model.pt")
    args = p.parse_args(argv)
    try:
        tag, params = export(args.checkpoint, args.out)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {params:,} parameters from {tag}")
    return 0
