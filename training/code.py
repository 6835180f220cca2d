"""The job's own code (`python -m infra run --code DIR`), on the import path before the trainer
imports a "package.module:function" builder.

TRAIN_CODE_URI names the folder as the job spool keeps it, an s3:// .tar.gz, or a local
folder. The launcher fetches and unpacks it once per node, puts it first on sys.path and
on PYTHONPATH (which its ranks inherit), and takes care of the folder's requirements.txt:
the image is the job's pinned environment, so a requirement the image already meets is
used as it is, one that conflicts with the image's version is refused in one line (exit 2,
before any rank starts), and one the image lacks is installed into the code's own folder
(`pip install --target`), never over the image's packages.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from training.contract import CODE_URI_ENV
from training.environment import TrainerEnv
from training.spec.config import ConfigError

REQUIREMENTS = "requirements.txt"
DEPENDENCIES = "_requirements"  # inside the unpacked folder: what pip installed for it


def use_job_code(env: TrainerEnv) -> Path | None:
    """Put the job's code (TRAIN_CODE_URI) on the import path; its folder, None without one."""
    uri = env.code_uri
    if not uri:
        return None
    folder = Path(uri) if not uri.startswith("s3://") else _unpacked(uri)
    if not folder.is_dir():
        raise ConfigError(f"{CODE_URI_ENV}={uri}: not a folder or an s3:// archive of one")
    paths = [folder]
    missing = _missing_requirements(folder / REQUIREMENTS)
    if missing:
        target = folder / DEPENDENCIES
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target)]
        subprocess.run([*command, *map(str, missing)], check=True)
        paths.append(target)
    for path in reversed(paths):
        sys.path.insert(0, str(path))
    inherited = [env.python_path] if env.python_path else []
    os.environ["PYTHONPATH"] = os.pathsep.join([*map(str, paths), *inherited])
    return folder


def _unpacked(uri: str) -> Path:
    """The archive at `uri`, unpacked into a folder named after its content."""
    import boto3

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    folder = Path(tempfile.gettempdir()) / "job-code" / hashlib.sha256(body).hexdigest()[:16]
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Unpacked beside, then renamed: a folder of that name is always whole.
        staging = Path(tempfile.mkdtemp(dir=folder.parent))
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
            archive.extractall(staging, filter="data")  # no path outside the folder
        staging.rename(folder)
    return folder


def _missing_requirements(path: Path) -> list:
    """The requirements of `path` the image lacks; ConfigError on one it has another version of."""
    return requirements_against(path, _installed_version, "the image's")


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def requirements_against(path: Path, version_of: Callable[[str], str | None], whose: str) -> list:
    """The requirements of `path` that `version_of` (a package's version, None when absent)
    lacks; ConfigError on one it has another version of. The node checks against what the
    image has installed, `run --code` against the image's lock file, before uploading."""
    if not path.is_file():
        return []
    # Here: the command line imports CODE_URI_ENV from this module without the trainer's
    # packages (packaging comes with DeepSpeed).
    from packaging.requirements import InvalidRequirement, Requirement

    missing = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement as error:
            raise ConfigError(
                f"{path.name} line {number}: {text!r} is not a requirement ({error})"
            ) from None
        installed = version_of(requirement.name)
        if installed is None:
            missing.append(requirement)
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            raise ConfigError(
                f"{path.name} line {number}: {text!r} conflicts with {whose} "
                f"{requirement.name} {installed}: drop the line (the image's version is used) "
                "or build an image with it"
            )
    return missing
