"""`python -m images smoke <variant>`: check a built image from the inside, with buildah.

No Docker engine is needed (and `podman run` may not work where this runs): a working
container from the image runs (1) image_check.py, which compares the versions inside
with the matrix, and (2) a short 2-rank ZeRO-2 training job whose checkpoints and
metrics land in host folders; the job must finish, its loss must fall, and a committed
checkpoint must exist. The image's config (labels, env, user, entrypoint) is checked too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from images.base import buildah_command
from images.build_args import IMAGE_NAME
from images.matrix import Matrix, Variant
from images.workflow import expectations

IMAGE_CHECK = Path(__file__).with_name("image_check.py")
TRAINER_UID = 1000  # the image's non-root user
# A short job: ZeRO-2, a checkpoint midway and at the end, a loss logged every step.
TRAINING_OVERRIDES = (
    "zero.stage=2",
    "train.steps=12",
    "checkpoint.every_steps=6",
    "logging.every_steps=1",
    "logging.progress_bar=false",
)
COMMIT_MARKER = "commit.json"  # the trainer writes it last: a checkpoint only counts with it


class SmokeError(RuntimeError):
    """The image is missing, cannot run, or does not behave as the matrix says."""


def local_image(variant: Variant, release: str) -> str:
    return f"localhost/{IMAGE_NAME}:{variant.tag(release)}"


def config_problems(config: dict, variant: Variant, release: str) -> list[str]:
    """What in the image's config (docker format) disagrees with the matrix."""
    labels = config.get("Labels") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    expected_labels = {
        "org.opencontainers.image.version": variant.tag(release),
        "org.gpu-training-stack.torch": variant.torch,
        "org.gpu-training-stack.deepspeed": variant.deepspeed,
        "org.gpu-training-stack.cuda": variant.cuda or "",
    }
    problems = [
        f"label {key}={labels.get(key)!r}, expected {want!r}"
        for key, want in expected_labels.items()
        if labels.get(key) != want
    ]
    expected_env = {
        "TRAIN_CHECKPOINT_DIR": "/checkpoints",
        "TRAIN_MIN_DRIVER": variant.min_driver or "",
    }
    problems += [
        f"env {key}={env.get(key)!r}, expected {want!r}"
        for key, want in expected_env.items()
        if env.get(key) != want
    ]
    user = (config.get("User") or "root").split(":")[0]
    if user in ("", "0", "root"):
        problems.append(f"the image runs as root (User={config.get('User')!r})")
    if not (config.get("Entrypoint") or [""])[0].endswith("tini"):
        entrypoint = config.get("Entrypoint")
        problems.append(f"entrypoint {entrypoint!r} is not tini: signals may not reach the trainer")
    if config.get("Cmd") != ["python", "-m", "training"]:
        problems.append(f"default command {config.get('Cmd')!r}, expected python -m training")
    return problems


def run_problems(output_dir: Path, checkpoint_dir: Path) -> list[str]:
    """What the training job's outputs show went wrong: no falling loss, no committed checkpoint."""
    metrics = output_dir / "metrics.jsonl"
    if not metrics.exists():
        return [f"no {metrics}: the job wrote no metrics"]
    losses = [
        record["loss"]
        for record in map(json.loads, metrics.read_text().splitlines())
        if "loss" in record
    ]
    problems = []
    if len(losses) < 2:
        problems.append(f"{metrics} has {len(losses)} loss values; need at least 2")
    elif not losses[-1] < losses[0]:
        problems.append(f"loss did not fall: first {losses[0]:.4f}, last {losses[-1]:.4f}")
    if not list(checkpoint_dir.rglob(COMMIT_MARKER)):
        problems.append(f"no committed checkpoint ({COMMIT_MARKER}) under {checkpoint_dir}")
    return problems


def _buildah(storage_driver: str | None, *args: str, capture: bool = False) -> str:
    argv = [*buildah_command(storage_driver), *args]
    print("+", " ".join(argv), flush=True)
    result = subprocess.run(argv, capture_output=capture, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-1:] if capture else []
        reason = f": {detail[0]}" if detail else " (its output is above)"
        raise SmokeError(f"{' '.join(argv[:4])}... exited {result.returncode}{reason}")
    return result.stdout if capture else ""


def image_size(image: str, storage_driver: str | None) -> str:
    out = _buildah(storage_driver, "images", "--format", "{{.Size}}", image, capture=True)
    return out.strip()


def main(matrix: Matrix, variant: Variant, storage_driver: str | None, workdir: Path) -> None:
    if shutil.which("buildah") is None:
        raise SmokeError("smoke needs buildah on PATH (Debian: apt-get install buildah)")
    image = local_image(variant, matrix.release)
    inspected = json.loads(
        _buildah(storage_driver, "inspect", "--type", "image", image, capture=True)
    )
    problems = config_problems(inspected["Docker"]["config"], variant, matrix.release)

    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    checkpoints, outputs = workdir / "checkpoints", workdir / "out"
    for folder in (checkpoints, outputs):
        folder.mkdir(parents=True)
        shutil.chown(folder, TRAINER_UID, TRAINER_UID)
    shutil.copy(IMAGE_CHECK, workdir / IMAGE_CHECK.name)

    container = f"smoke-{variant.name}"
    subprocess.run(
        [*buildah_command(storage_driver), "rm", container], capture_output=True, check=False
    )
    _buildah(storage_driver, "from", "--name", container, "--pull-never", image, capture=True)
    run = ["run", "--isolation", "chroot", "--network", "host", "-v", f"{workdir}:/smoke"]
    try:
        _buildah(
            storage_driver,
            *run,
            container,
            "--",
            "python",
            f"/smoke/{IMAGE_CHECK.name}",
            *expectations(variant),
        )
        overrides = [arg for item in TRAINING_OVERRIDES for arg in ("--set", item)]
        _buildah(
            storage_driver,
            *run,
            "-v",
            f"{checkpoints}:/checkpoints",
            "-e",
            "TRAIN_OUTPUT_DIR=/smoke/out",
            "-e",
            "TRAIN_NPROC_PER_NODE=2",
            container,
            "--",
            "python",
            "-m",
            "training",
            *overrides,
        )
    finally:
        subprocess.run(
            [*buildah_command(storage_driver), "rm", container], capture_output=True, check=False
        )
    problems += run_problems(outputs, checkpoints)
    print(f"image {image}: {image_size(image, storage_driver)} uncompressed")
    if problems:
        raise SmokeError("; ".join(problems))
    print(f"smoke {variant.name}: OK (versions, config, 2-rank ZeRO-2 run, committed checkpoint)")
