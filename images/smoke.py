"""`python -m images smoke <variant>`: check a built image from the inside, with buildah.

No Docker engine is needed (and `podman run` may not work where this runs): a working
container of the image runs, with the image's own entrypoint and command,
(1) image_check.py, which compares the versions inside with the matrix; (2) a short
2-rank ZeRO-2 job whose checkpoints and metrics land in host folders: it must exit 0,
its loss must fall, a committed checkpoint must exist, and no DeepSpeed op may have been
compiled at run time (TORCH_EXTENSIONS_DIR stays empty); (3) the trainer started the way
Pyxis/Enroot starts it: as another uid than the image's USER, without the ENTRYPOINT,
with a HOME that does not exist; (4) a long job stopped with SIGTERM sent to the
entrypoint (tini, PID 1 under `docker run`), which must checkpoint and exit 75; that job
is started with options alone (`docker run IMAGE --set ...`), which the entrypoint script
turns into `python -m training --set ...`. The image's config (labels, env, user,
entrypoint) is checked too.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from images.base import buildah_command
from images.build_args import IMAGE_NAME
from images.ci_matrix import expectations
from images.matrix import Matrix, Variant
from training.checkpoint.layout import COMMIT_MARKER  # written last: a checkpoint counts with it
from training.contract import ExitCode

IMAGE_CHECK = Path(__file__).with_name("image_check.py")
TRAINER_UID = 1000  # the image's non-root user
# images/entrypoint.sh, the Dockerfile's ENTRYPOINT after tini.
ENTRYPOINT_SCRIPT = "entrypoint.sh"
# Enroot runs the container as the user who called srun, whatever the image's USER says.
SLURM_USER_UID = 4242
# A short job: ZeRO-2, a checkpoint midway and at the end, a loss logged every step.
TRAINING_OVERRIDES = (
    "zero.stage=2",
    "train.steps=12",
    "checkpoint.every_steps=6",
    "logging.every_steps=1",
)
# Off EC2 there is no metadata service to poll for spot notices: empty turns polling off.
JOB_ENV = {"TRAIN_OUTPUT_DIR": "/smoke/out", "TRAIN_NPROC_PER_NODE": "2", "TRAIN_SPOT_ENDPOINT": ""}


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
        "DS_ACCELERATOR": variant.accelerator,
    }
    problems += [
        f"env {key}={env.get(key)!r}, expected {want!r}"
        for key, want in expected_env.items()
        if env.get(key) != want
    ]
    user = (config.get("User") or "root").split(":")[0]
    if user in ("", "0", "root"):
        problems.append(f"the image runs as root (User={config.get('User')!r})")
    entrypoint = config.get("Entrypoint") or [""]
    if not entrypoint[0].endswith("tini"):
        problems.append(f"entrypoint {entrypoint!r} is not tini: signals may not reach the trainer")
    if not entrypoint[-1].endswith(ENTRYPOINT_SCRIPT):
        problems.append(
            f"entrypoint {entrypoint!r} does not end in {ENTRYPOINT_SCRIPT}: "
            "`docker run IMAGE --config job.toml` would not train"
        )
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


def _buildah(storage_driver: str | None, *args: str) -> str:
    """Run a buildah command that must succeed; return its output."""
    argv = [*buildah_command(storage_driver), *args]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SmokeError(f"{' '.join(argv[:4])}... exited {result.returncode}: {detail[0]}")
    return result.stdout


def descendants(pid: int) -> list[int]:
    """Every process below pid (chroot isolation shares the host's PID namespace)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _process_running(pid: int, executable: str) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == executable.encode()
    except OSError:
        return False


class SmokeContainer:
    """A buildah working container of the image, run like `docker run` would run it."""

    def __init__(self, image: str, storage_driver: str | None, name: str, config: dict):
        self.buildah = buildah_command(storage_driver)
        self.name = name
        # `docker run IMAGE ARGS` runs the Entrypoint with ARGS in place of the Cmd.
        self.entrypoint = [*(config.get("Entrypoint") or [])]
        self.default_command = [*self.entrypoint, *(config.get("Cmd") or [])]
        subprocess.run([*self.buildah, "rm", name], capture_output=True, check=False)
        _buildah(storage_driver, "from", "--name", name, "--pull-never", image)

    def argv(
        self, command: list[str], mounts: dict[Path, str], env: dict[str, str], user: str = ""
    ) -> list[str]:
        argv = [*self.buildah, "run", "--isolation", "chroot", "--network", "host"]
        argv += ["--user", user] if user else []
        argv += [arg for host, inside in mounts.items() for arg in ("-v", f"{host}:{inside}")]
        argv += [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
        return [*argv, self.name, "--", *command]

    def run(
        self, command: list[str], mounts: dict[Path, str], env: dict[str, str], user: str = ""
    ) -> int:
        argv = self.argv(command, mounts, env, user)
        print("+", shlex.join(argv), flush=True)
        return subprocess.run(argv, check=False).returncode

    def remove(self) -> None:
        subprocess.run([*self.buildah, "rm", self.name], capture_output=True, check=False)


def _job_folders(root: Path, *names: str, uid: int = TRAINER_UID) -> list[Path]:
    """Host folders for one job (checkpoints, outputs, ...), writable by `uid`."""
    folders = [root / name for name in names]
    for folder in folders:
        folder.mkdir(parents=True)
        os.chown(folder, uid, uid)
    return folders


def check_training(container: SmokeContainer, root: Path) -> list[str]:
    """The image's default command, 2 ranks, ZeRO-2: exit 0, loss falls, checkpoint committed,
    and no op compiled at run time (every op the first step loads was built into the image)."""
    checkpoints, outputs, extensions = _job_folders(root, "checkpoints", "out", "extensions")
    overrides = [arg for item in TRAINING_OVERRIDES for arg in ("--set", item)]
    code = container.run(
        [*container.default_command, *overrides],
        {checkpoints: "/checkpoints", outputs: "/smoke/out", extensions: "/smoke/extensions"},
        {**JOB_ENV, "TORCH_EXTENSIONS_DIR": "/smoke/extensions"},
    )
    problems = [] if code == ExitCode.DONE else [f"the training job exited {code}, expected 0"]
    compiled = sorted(path.name for path in extensions.iterdir())
    if compiled:
        problems.append(f"DeepSpeed compiled {', '.join(compiled)} at run time: pre-build it")
    return problems + run_problems(outputs, checkpoints)


def check_as_slurm_starts_it(container: SmokeContainer, root: Path) -> list[str]:
    """`srun --container-image=... python -m training`: Pyxis runs no ENTRYPOINT by default,
    Enroot runs the command as the calling user, and HOME is that user's host folder."""
    checkpoints, outputs = _job_folders(root, "checkpoints", "out", uid=SLURM_USER_UID)
    overrides = ["--set", "train.steps=2", "--set", "checkpoint.every_steps=2"]
    env = {**JOB_ENV, "TRAIN_NPROC_PER_NODE": "1", "HOME": "/home/not-in-the-image"}
    code = container.run(
        ["python", "-m", "training", *overrides],
        {checkpoints: "/checkpoints", outputs: "/smoke/out"},
        env,
        user=f"{SLURM_USER_UID}:{SLURM_USER_UID}",
    )
    problems = (
        [] if code == ExitCode.DONE else [f"as uid {SLURM_USER_UID}, no entrypoint: exit {code}"]
    )
    if not list(checkpoints.rglob(COMMIT_MARKER)):
        problems.append(f"as uid {SLURM_USER_UID} without the entrypoint: no committed checkpoint")
    return problems


def check_interrupt(container: SmokeContainer, root: Path, timeout: float = 300) -> list[str]:
    """SIGTERM to the entrypoint (what `docker stop` does) must end in a checkpoint and exit 75.
    The job is given options alone, as `docker run IMAGE --set ...` gives them."""
    checkpoints, outputs = _job_folders(root, "checkpoints", "out")
    overrides = ["--set", "train.steps=1000000", "--set", "logging.every_steps=1"]
    argv = container.argv(
        [*container.entrypoint, *overrides],
        {checkpoints: "/checkpoints", outputs: "/smoke/out"},
        JOB_ENV,
    )
    print("+", shlex.join(argv), flush=True)
    job = subprocess.Popen(argv)
    metrics, deadline = outputs / "metrics.jsonl", time.monotonic() + timeout
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            if job.poll() is not None or time.monotonic() > deadline:
                return [f"the long job never logged 3 steps (exit code {job.poll()})"]
            time.sleep(0.5)
        pid1 = next(
            (pid for pid in descendants(job.pid) if _process_running(pid, container.entrypoint[0])),
            None,
        )
        if pid1 is None:
            return [f"no {container.entrypoint[0]} process under buildah run"]
        os.kill(pid1, signal.SIGTERM)
        code = job.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    expected = ExitCode.INTERRUPTED
    problems = (
        [] if code == expected else [f"after SIGTERM the job exited {code}, expected {expected}"]
    )
    if not list(checkpoints.rglob(COMMIT_MARKER)):
        problems.append("after SIGTERM no committed checkpoint exists")
    return problems


def main(matrix: Matrix, variant: Variant, storage_driver: str | None, workdir: Path) -> None:
    if shutil.which("buildah") is None:
        raise SmokeError("smoke needs buildah on PATH (Debian: apt-get install buildah)")
    image = local_image(variant, matrix.release)
    inspected = json.loads(_buildah(storage_driver, "inspect", "--type", "image", image))
    config = inspected["Docker"]["config"]
    problems = config_problems(config, variant, matrix.release)

    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    shutil.copy(IMAGE_CHECK, workdir / IMAGE_CHECK.name)
    container = SmokeContainer(image, storage_driver, f"smoke-{variant.name}", config)
    try:
        check = ["python", f"/smoke/{IMAGE_CHECK.name}", *expectations(matrix, variant)]
        if container.run(check, {workdir: "/smoke"}, {}) != 0:
            problems.append("image_check.py found versions that differ from the matrix (above)")
        problems += check_training(container, workdir / "train")
        problems += check_as_slurm_starts_it(container, workdir / "slurm")
        problems += check_interrupt(container, workdir / "interrupt")
    finally:
        container.remove()
    size = _buildah(storage_driver, "images", "--format", "{{.Size}}", image).strip()
    print(f"image {image}: {size} uncompressed")
    if problems:
        raise SmokeError("; ".join(problems))
    print(
        f"smoke {variant.name}: OK (versions, image config, 2-rank ZeRO-2 job with a committed "
        "checkpoint and no op compiled at run time, a job as another uid without the "
        "entrypoint, SIGTERM through the entrypoint -> checkpoint and exit 75)"
    )
