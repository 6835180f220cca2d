"""The image a stack's nodes pull, before `up` creates them: is it in the stack's
repository, and if not, build and push it here (docker), so no GPU waits for it.

ECR facts: DescribeImages answers ImageNotFoundException for a tag or digest the repository
lacks, RepositoryNotFoundException for a repository that does not exist (ECR API reference,
DescribeImages); GetAuthorizationToken returns base64 "AWS:<password>" for `docker login`
at the registry (ECR User Guide, "Private registry authentication").
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from infra.errors import ConfigError
from infra.project import find_project_root


@dataclass(frozen=True)
class ImageRef:
    """`<registry>/<repository>:<tag>[@<digest>]`, as the stack's image_uri output says it."""

    registry: str
    repository: str
    tag: str
    digest: str | None

    @classmethod
    def parse(cls, uri: str) -> ImageRef:
        name, _, digest = uri.partition("@")
        registry, _, rest = name.partition("/")
        repository, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
        return cls(registry, repository, tag, digest or None)

    def __str__(self) -> str:
        pinned = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}:{self.tag}{pinned}"


def is_pushed(ecr: Any, image: ImageRef) -> bool:
    """Whether the repository holds the image (its digest when pinned, else its tag)."""
    wanted = {"imageDigest": image.digest} if image.digest else {"imageTag": image.tag}
    try:
        ecr.describe_images(repositoryName=image.repository, imageIds=[wanted])
    except (ecr.exceptions.ImageNotFoundException, ecr.exceptions.RepositoryNotFoundException):
        return False
    return True


def can_build() -> bool:
    return shutil.which("docker") is not None


def build_and_push(ecr: Any, image: ImageRef, variant: str, *, say) -> None:
    """Log docker in to the stack's registry, then `python -m images build VARIANT --push`
    into its repository; ConfigError, after the build's own output, when it fails."""
    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().partition(":")[2]
    login = subprocess.run(
        ["docker", "login", "--username", "AWS", "--password-stdin", image.registry],
        input=password,
        capture_output=True,
        text=True,
        check=False,
    )
    if login.returncode != 0:
        raise ConfigError(
            f"docker could not log in to {image.registry}: {login.stderr.strip()}; "
            "no GPU node was created"
        )
    say(f"building {variant} and pushing it to {image} (no GPU node exists yet)")
    build = [sys.executable, "-m", "images", "build", variant, "--push", image.registry]
    build += ["--image-name", image.repository]
    if subprocess.run(build, cwd=find_project_root(), check=False).returncode != 0:
        raise ConfigError(
            f"the {variant} image did not build or push (its output is above): fix it and "
            "run `up` again; no GPU node was created"
        )
