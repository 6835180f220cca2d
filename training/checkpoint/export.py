"""`python -m training export CHECKPOINT out.pt`: full fp32 weights from a checkpoint.

CHECKPOINT is a checkpoint root (the newest committed step is taken) or one step folder
(`<root>/step_00001000`). The result is a plain `state_dict` for `model.load_state_dict`,
with no DeepSpeed needed to read it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from training.checkpoint.layout import (
    COMMIT_MARKER,
    COMPLETE,
    examine,
    parse_step,
    read_manifest,
    step_dirs,
)


class ExportError(Exception):
    """The path holds no loadable checkpoint, or the output cannot be written;
    str(error) is the one-line reason."""


def locate(path: Path, *, warn=lambda message: None) -> tuple[Path, str]:
    """(checkpoint root, tag) of a step folder, or of a root's newest loadable step.

    Every file is verified against the manifest's checksums first. In a root, a
    damaged newer checkpoint is skipped with a warning naming the file, as resume does.
    """
    if parse_step(path.name) is not None and (path / COMMIT_MARKER).exists():
        state, reason = examine(path, verify=True)
        if state != COMPLETE:
            raise ExportError(f"{path} cannot be exported: it is {state} ({reason})")
        return path.parent, path.name
    tags = step_dirs(path)
    for tag in reversed(tags):
        state, reason = examine(path / tag, verify=True)
        if state == COMPLETE:
            return path, tag
        if (path / tag / COMMIT_MARKER).exists():
            warn(f"skipping {path / tag}: it is {state} ({reason})")
    raise ExportError(
        f"{path} holds no loadable checkpoint: expected a step folder with {COMMIT_MARKER} "
        f"or a checkpoint root holding such folders ({len(tags)} step folder(s) there, "
        "none complete)"
    )


def check_output(out: Path) -> None:
    """Refuse an output that is a directory or cannot be written, before anything loads."""
    if out.is_dir():
        raise ExportError(f"{out} is a directory: give a file name, e.g. {out / 'model.pt'}")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ExportError(f"cannot write {out}: {parent} is a file, not a folder")
    if not os.access(out if out.exists() else parent, os.W_OK):
        raise ExportError(f"cannot write {out}: permission denied; choose a writable path")


def fp32_state_dict(root: Path, tag: str) -> dict[str, torch.Tensor]:
    record = read_manifest(root / tag)
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
    check_output(out)
    root, tag = locate(
        checkpoint, warn=lambda message: print(f"warning: {message}", file=sys.stderr)
    )
    state = fp32_state_dict(root, tag)
    out.parent.mkdir(parents=True, exist_ok=True)  # check_output found it can be made
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
