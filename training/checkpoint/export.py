"""`python -m training export CHECKPOINT out.pt|OUT_DIR`: full fp32 weights from a checkpoint.

CHECKPOINT is a checkpoint root (the newest committed step is taken) or one step folder
(`<root>/step_00001000`). The result is a plain `state_dict` for `model.load_state_dict`,
with no DeepSpeed needed to read it; for a model.hf run, a folder without a .pt suffix gets
the Hugging Face format instead (training/hf/export.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from training.checkpoint.layout import (
    CLIENT_STATE_KEY,
    COMMIT_MARKER,
    COMPLETE,
    UNIVERSAL_DIR,
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
    if record.get("tensor", 1) > 1:
        # Each tensor rank saved its slices (mp_rank_NN), which zero_to_fp32 does not join:
        # DeepSpeed's universal conversion does, one full fp32 tensor per parameter
        # (zero/<name>/fp32.pt, deepspeed/checkpoint/ds_to_universal.py).
        from training.checkpoint.resume import convert_to_universal

        convert_to_universal(root, tag)
        params = root / UNIVERSAL_DIR / tag / "zero"
        return {
            folder.name: torch.load(folder / "fp32.pt", map_location="cpu", weights_only=False)[
                "param"
            ]
            for folder in sorted(params.iterdir())
            if folder.is_dir()  # beside them: optimizer_state.pt, the common state
        }
    if record["zero_stage"] == 0:
        # Without ZeRO the model file holds every weight (in the training dtype).
        states = torch.load(
            root / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
        )
        return {name: tensor.float() for name, tensor in states["module"].items()}
    # ZeRO 1-3: rebuild full fp32 weights from the optimizer's partitioned master copy.
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag)


def check_output_folder(out: Path) -> None:
    """Refuse a folder that holds something, or cannot be made, before anything loads."""
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(
            f"{out} is a directory that holds files: give a file name, e.g. "
            f"{out / 'model.pt'}, or for a model.hf run a new folder"
        )
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file: give a new folder for a model.hf run")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ExportError(f"cannot write {out}: {parent} is not a writable folder")


def hf_metadata(root: Path, tag: str) -> dict | None:
    """A model.hf run's export metadata (training/hf/export.py), None for other runs."""
    from training.hf.export import METADATA_KEY

    # Rank 0's model states: named per data-parallel rank at ZeRO-3
    # (deepspeed/runtime/engine.py, _get_ckpt_name).
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (root / tag / name).is_file():
            states = torch.load(root / tag / name, map_location="cpu", weights_only=False)
            return states.get(CLIENT_STATE_KEY, {}).get(METADATA_KEY)
    return None


def export(checkpoint: Path, out: Path, dtype: str | None = None) -> tuple[str, int]:
    """Write the weights to `out` (a folder in Hugging Face's format for a model.hf run
    when `out` has no .pt suffix); return the tag exported and the number of parameters."""
    folder = out.suffix != ".pt" and (out.is_dir() or not out.suffix)
    if folder:
        check_output_folder(out)
    else:
        check_output(out)
    root, tag = locate(
        checkpoint, warn=lambda message: print(f"warning: {message}", file=sys.stderr)
    )
    if folder:
        carried = hf_metadata(root, tag)
        if carried is None:
            raise ExportError(
                f"{root / tag} is not of a model.hf run, which alone exports to a folder: give "
                "a file name, e.g. model.pt"
            )
        from training.hf.export import export_folder

        return tag, export_folder(fp32_state_dict(root, tag), carried, out, dtype)
    state = fp32_state_dict(root, tag)
    out.parent.mkdir(parents=True, exist_ok=True)  # check_output found it can be made
    torch.save(state, out)
    unique = {tensor.data_ptr(): tensor.numel() for tensor in state.values()}
    return tag, sum(unique.values())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training export",
        description="Write a checkpoint's full fp32 weights as a plain PyTorch state_dict, "
        "or a model.hf run's as a Hugging Face model folder.",
    )
    p.add_argument("checkpoint", type=Path, help="checkpoint root or one step_NNNNNNNN folder")
    p.add_argument(
        "out",
        type=Path,
        help="output file, e.g. model.pt; for a model.hf run, a new folder for from_pretrained",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        help="a Hugging Face folder's weights (default: the run's precision)",
    )
    args = p.parse_args(argv)
    try:
        tag, params = export(args.checkpoint, args.out, args.dtype)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {params:,} parameters from {tag}")
    return 0
