"""The image variant matrix: images/matrix.toml loaded into checked, frozen records.

Every consumer (the image build, CI, the infra resolver, the container's
start-up check) reads variants from here, never from its own copy of the facts.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from pathlib import Path
from typing import Any

from pydantic import field_validator

from common.records import DataFile, build_record, matching, record
from common.versions import dotted_version, version_key

MATRIX_PATH = Path(__file__).with_name("matrix.toml")

_BASE_OS = re.compile(r"ubuntu\d+\.\d+|bookworm")

# A tag, optionally pinned to a digest: nvidia/cuda:13.0.1-base-ubuntu24.04@sha256:<64 hex>.
_NVIDIA_CUDA_IMAGE = re.compile(
    r"^nvidia/cuda:(\d+\.\d+)\.\d+-(base|runtime|devel)-[a-z0-9.]+(@sha256:[0-9a-f]{64})?$"
)


class MatrixError(ValueError):
    """A matrix file that is malformed or contradicts itself (one line)."""


def arch_key(capability: str) -> tuple[int, int]:
    """Split a compute capability for comparison: 8.6 -> (8, 6)."""
    major, _, minor = capability.partition(".")
    return int(major), int(minor)


def check_capability(value: str) -> str:
    """A compute capability written "X.Y" (8.0, not sm_80 or 8)."""
    if not re.fullmatch(r"\d+\.\d", value):
        raise ValueError(f"compute capability {value!r} is not written X.Y (e.g. 8.0 for sm_80)")
    return value


def _capabilities(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(map(check_capability, values), key=arch_key))


@record
class TorchWheels:
    """What one torch release ships in one wheel variant (cu128, cu130, cpu...)."""

    source: str
    compute_capabilities: tuple[str, ...] = ()
    cudnn: str | None = None
    nccl: str | None = None
    # PyPI's plain torch==<release> is this build (its nvidia-* wheels are on PyPI too).
    pypi_default: bool = False

    _check_capabilities = field_validator("compute_capabilities")(_capabilities)


@record
class BaseOs:
    """What a base OS maintains: its system python3, and its glibc (the wheels' platform)."""

    python: str
    glibc: str
    source: str

    _check_versions = field_validator("python", "glibc")(dotted_version)


@record
class CudaMajor:
    """What one CUDA major's toolkit supports: its oldest GPU arch, the arches nvcc refuses."""

    oldest_arch: str
    source: str
    nvcc_refuses: tuple[str, ...] = ()

    _check_oldest = field_validator("oldest_arch")(check_capability)
    _check_refused = field_validator("nvcc_refuses")(_capabilities)


@record
class DeepSpeedOps:
    """DeepSpeed ops pre-built for one accelerator: DS_BUILD_<KEY> -> name in `ds_report`."""

    ops: dict[str, str]
    source: str


@record
class Efa:
    """The EFA installer every CUDA image carries, and the key its signature must come from."""

    installer: str
    installer_gpg_fingerprint: str
    source: str

    _check_versions = field_validator("installer")(dotted_version)

    _fingerprint = field_validator("installer_gpg_fingerprint")(
        matching(r"[0-9A-F]{40}", "must be 40 upper-case hex digits, without spaces")
    )


_COMMIT = matching(r"[0-9a-f]{40}", "must be the 40 lower-case hex digits of a git commit")


@record
class NetPlugin:
    """One aws-ofi-nccl release: the commit its tag must point at, and the NCCL series its
    release notes say it was tested with."""

    version: str
    commit: str
    tested_nccl: tuple[str, ...]
    source: str

    _check_version = field_validator("version")(dotted_version)
    _check_commit = field_validator("commit")(_COMMIT)

    def tested_with(self, nccl: str) -> bool:
        """True when the release notes name this NCCL's major.minor series."""
        return ".".join(nccl.split(".")[:2]) in self.tested_nccl


@record
class NcclTests:
    """The nccl-tests release whose all_reduce_perf the CUDA images carry."""

    version: str
    commit: str
    source: str

    _check_version = field_validator("version")(dotted_version)
    _check_commit = field_validator("commit")(_COMMIT)


@record
class CpuIsa:
    """The instruction set the pre-built ops' host code targets, the same on every builder."""

    march: str
    simd: str
    source: str


@record
class Variant:
    """One image variant: what the image carries and which GPUs and drivers it needs."""

    name: str
    base_build: str
    base_runtime: str
    python: str
    torch: str
    torch_index: str
    deepspeed: str
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    compute_capabilities: tuple[str, ...] = ()
    min_driver: str | None = None
    compat_driver_floor: str | None = None
    sources: dict[str, str] = field(default_factory=dict, hash=False)

    _check_capabilities = field_validator("compute_capabilities")(_capabilities)
    _check_versions = field_validator(
        "cuda", "python", "torch", "deepspeed", "cudnn", "nccl", "min_driver", "compat_driver_floor"
    )(dotted_version)

    _lowercase_name = field_validator("name")(
        matching(r"[a-z0-9]+", "must be lowercase letters and digits (it is part of the image tag)")
    )

    @property
    def accelerator(self) -> str:
        """DeepSpeed's accelerator: set explicitly, as a CI builder has no GPU to detect."""
        return "cuda" if self.cuda else "cpu"

    @property
    def wheel_variant(self) -> str:
        """The torch wheel variant this image installs: the last part of torch_index."""
        return self.torch_index.rstrip("/").rsplit("/", 1)[-1]

    def tag(self, release: str) -> str:
        """The image tag: <release>-torch<torch>-<name>-py<python>."""
        return f"{release}-torch{self.torch}-{self.name}-py{self.python}"

    def runs_on(self, capability: str) -> bool:
        """True when the torch wheels have kernels a GPU of `capability` can run.

        A GPU runs cubins built for its own major architecture and a lower or
        equal minor one (sm_89 L40S runs sm_86 code; sm_90 cannot run sm_86).
        PTX just-in-time compilation is not counted: it is slow to start and
        fails on drivers older than the compiler.
        """
        major, minor = arch_key(capability)
        return any(
            built_major == major and built_minor <= minor
            for built_major, built_minor in map(arch_key, self.compute_capabilities)
        )


@dataclasses.dataclass(frozen=True)
class Matrix:
    """All variants (oldest CUDA first, cpu first of all), the image release, and the
    toolchain facts every variant is checked against."""

    release: str
    variants: tuple[Variant, ...]
    torch_wheels: dict[str, dict[str, TorchWheels]] = field(hash=False)
    base_os: dict[str, BaseOs] = field(hash=False)
    cuda_majors: dict[str, CudaMajor] = field(hash=False)
    deepspeed_ops: dict[str, DeepSpeedOps] = field(hash=False)
    efa: Efa
    net_plugins: tuple[NetPlugin, ...]  # oldest release first
    nccl_tests: NcclTests
    cpu_isa: CpuIsa

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variants)

    def variant(self, name: str) -> Variant:
        for candidate in self.variants:
            if candidate.name == name:
                return candidate
        raise MatrixError(f"unknown image variant {name!r} (known: {', '.join(self.names)})")

    def wheels(self, variant: Variant) -> TorchWheels:
        """What the variant's torch build ships (the loader checked that it is known)."""
        return self.torch_wheels[variant.torch][variant.wheel_variant]

    def os_of(self, variant: Variant) -> BaseOs:
        """The base OS of the variant's images (the loader checked that it is known)."""
        return self.base_os[_BASE_OS.search(variant.base_runtime)[0]]

    def cuda_major(self, variant: Variant) -> CudaMajor | None:
        """The toolkit facts for the variant's CUDA major (None: cpu, or none recorded)."""
        return self.cuda_majors.get(variant.cuda.split(".")[0]) if variant.cuda else None

    def ops(self, variant: Variant) -> dict[str, str]:
        """The DeepSpeed ops the variant's image pre-builds: DS_BUILD_<KEY> -> op name."""
        return self.deepspeed_ops[variant.accelerator].ops

    def net_plugin(self, variant: Variant) -> NetPlugin | None:
        """The newest aws-ofi-nccl release tested with the variant's NCCL (None: cpu)."""
        if variant.nccl is None:
            return None
        tested = [p for p in self.net_plugins if p.tested_with(variant.nccl)]
        return tested[-1] if tested else None


_TABLES = {
    "release",
    "variant",
    "torch_wheels",
    "base_os",
    "cuda_major",
    "deepspeed_ops",
    "efa",
    "aws_ofi_nccl",
    "nccl_tests",
    "cpu_isa",
}


def load_matrix(path: Path | str | None = None) -> Matrix:
    """Load and check images/matrix.toml (or `path`); raise MatrixError in one line."""
    path = Path(path) if path is not None else MATRIX_PATH
    file = DataFile.read(path, _TABLES, MatrixError)
    where = file.name
    release = file.raw.get("release")
    if not isinstance(release, str) or not release:
        raise file.fail(f"key 'release' must be a version string, got {release!r}")

    wheels = _load_torch_wheels(file.raw.get("torch_wheels", {}), where)
    facts = {
        "base_os": file.tables(BaseOs, "base_os", header="base_os.<name>"),
        "cuda_majors": file.tables(CudaMajor, "cuda_major", header="cuda_major.<name>"),
        "deepspeed_ops": file.tables(DeepSpeedOps, "deepspeed_ops", header="deepspeed_ops.<name>"),
        "efa": file.table(Efa, "efa"),
        "net_plugins": _load_net_plugins(file.raw.get("aws_ofi_nccl", {}), where),
        "nccl_tests": file.table(NcclTests, "nccl_tests"),
        "cpu_isa": file.table(CpuIsa, "cpu_isa"),
    }
    variants: list[Variant] = []
    for index, table in enumerate(file.raw.get("variant", [])):
        label = table.get("name", f"#{index + 1}") if isinstance(table, dict) else f"#{index + 1}"
        variant = build_record(
            Variant, table, where=f"{where}: variant '{label}'", error=MatrixError
        )
        variants.append(variant)
    if not variants:
        raise file.fail("no [[variant]] tables")
    variants.sort(key=lambda v: version_key(v.cuda) if v.cuda else ())
    matrix = Matrix(release=release, variants=tuple(variants), torch_wheels=wheels, **facts)
    for variant in variants:
        _check_variant(variant, matrix, f"{where}: variant '{variant.name}'")
    _check_unique(variants, where)
    return matrix


def _load_torch_wheels(raw: Any, where: str) -> dict[str, dict[str, TorchWheels]]:
    if not isinstance(raw, dict):
        raise MatrixError(f"{where}: 'torch_wheels' must be a table of torch releases")
    releases: dict[str, dict[str, TorchWheels]] = {}
    for torch, per_variant in raw.items():
        if not isinstance(per_variant, dict):
            raise MatrixError(f"{where}: torch_wheels.{torch} must be a table of wheel variants")
        releases[torch] = {
            name: build_record(
                TorchWheels,
                table,
                where=f"{where}: torch_wheels '{torch}' variant '{name}'",
                error=MatrixError,
            )
            for name, table in per_variant.items()
        }
    return releases


def _load_net_plugins(raw: Any, where: str) -> tuple[NetPlugin, ...]:
    if not isinstance(raw, dict) or not raw:
        raise MatrixError(
            f"{where}: 'aws_ofi_nccl' must be a table of releases ([aws_ofi_nccl.\"X.Y.Z\"])"
        )
    plugins = []
    for version, table in raw.items():
        if not isinstance(table, dict):
            raise MatrixError(f"{where}: aws_ofi_nccl.{version} must be a table")
        plugins.append(
            build_record(
                NetPlugin,
                {"version": version, **table},
                where=f"{where}: aws_ofi_nccl '{version}'",
                error=MatrixError,
            )
        )
    return tuple(sorted(plugins, key=lambda p: version_key(p.version)))


def _check_variant(v: Variant, matrix: Matrix, where: str) -> None:
    def fail(field_name: str, problem: str) -> MatrixError:
        return MatrixError(f"{where}, field '{field_name}': {problem}")

    _check_bases(v, fail)
    _check_python(v, matrix.base_os, fail)
    _check_cuda_fields(v, fail)
    if v.accelerator not in matrix.deepspeed_ops:
        raise fail("cuda", f"no [deepspeed_ops.{v.accelerator}] table says which ops to pre-build")

    release = matrix.torch_wheels.get(v.torch)
    if release is None:
        known = ", ".join(matrix.torch_wheels) or "none"
        raise fail("torch", f"no torch_wheels facts for torch {v.torch} (known: {known})")
    facts = release.get(v.wheel_variant)
    if facts is None:
        raise fail(
            "torch_index",
            f"torch {v.torch} ships no {v.wheel_variant!r} wheels "
            f"(torch_wheels knows: {', '.join(release)})",
        )
    for name in ("cudnn", "nccl"):
        have, want = getattr(v, name), getattr(facts, name)
        if have != want:
            raise fail(name, f"{have} disagrees with torch {v.torch} {v.wheel_variant} ({want})")
    if v.nccl and matrix.net_plugin(v) is None:
        known = ", ".join(p.version for p in matrix.net_plugins)
        raise fail(
            "nccl",
            f"no aws-ofi-nccl release in the matrix was tested with NCCL {v.nccl} (known: "
            f'{known}): add the release whose notes name it ([aws_ofi_nccl."X.Y.Z"])',
        )

    # Checked before the arch list so the message names the real cause.
    toolkit = matrix.cuda_major(v)
    if toolkit is not None:
        too_old = [c for c in v.compute_capabilities if arch_key(c) < arch_key(toolkit.oldest_arch)]
        if too_old:
            raise fail(
                "compute_capabilities",
                f"CUDA {v.cuda} cannot build for {', '.join(too_old)} (its oldest arch is "
                f"{toolkit.oldest_arch}); a Volta GPU needs a CUDA 12 variant",
            )
    if v.compute_capabilities != facts.compute_capabilities:
        raise fail(
            "compute_capabilities",
            f"{list(v.compute_capabilities)} differs from what torch {v.torch} "
            f"{v.wheel_variant} wheels carry ({list(facts.compute_capabilities)})",
        )
    missing = [name for name in _figures(v) if name not in v.sources]
    if missing:
        raise fail("sources", f"no source for {', '.join(missing)}")
    unknown = [name for name in v.sources if name not in _figures(v)]
    if unknown:
        raise fail("sources", f"source for a field that is not set: {', '.join(unknown)}")


def _figures(v: Variant) -> list[str]:
    """The fields of `v` that carry a fact (and so need a source)."""
    skip = {"name", "sources"}
    return [
        name
        for name in Variant.__dataclass_fields__
        if name not in skip and getattr(v, name) not in (None, ())
    ]


def _check_bases(v: Variant, fail) -> None:
    if v.cuda is None:
        for name in ("base_build", "base_runtime"):
            if getattr(v, name).startswith("nvidia/cuda"):
                raise fail(
                    name, "a CPU variant needs no nvidia/cuda base (use debian:bookworm-slim)"
                )
        return
    if "-cudnn" in v.base_runtime:
        raise fail(
            "base_runtime",
            f"{v.base_runtime} is a -cudnn- image; the torch wheels bring their own cuDNN, "
            "use the -base or -runtime tag",
        )
    for name, kinds in (("base_build", ("devel",)), ("base_runtime", ("base", "runtime"))):
        image = getattr(v, name)
        match = _NVIDIA_CUDA_IMAGE.match(image)
        if not match or match.group(2) not in kinds:
            example = f"nvidia/cuda:{v.cuda}.0-{kinds[0]}-ubuntu24.04"
            raise fail(name, f"{image} is not an nvidia/cuda -{'/-'.join(kinds)} image ({example})")
        if match.group(1) != v.cuda:
            raise fail(name, f"{image} carries CUDA {match.group(1)}, the variant says {v.cuda}")
        if match.group(3) is None:
            raise fail(
                name,
                f"{image} is a tag without a digest: pin it as {image}@sha256:<digest> "
                f"(`docker buildx imagetools inspect {image}` prints it)",
            )


def _check_python(v: Variant, base_os: dict[str, BaseOs], fail) -> None:
    systems = []
    for name in ("base_build", "base_runtime"):
        found = _BASE_OS.search(getattr(v, name))
        if found is None or found[0] not in base_os:
            known = ", ".join(base_os)
            raise fail(name, f"{getattr(v, name)}: no known system Python for its OS ({known})")
        systems.append(found[0])
    if systems[0] != systems[1]:
        raise fail("base_runtime", f"runs {systems[1]}, base_build {systems[0]}: one OS for both")
    expected = base_os[systems[0]].python
    if v.python != expected:
        raise fail(
            "python",
            f"{v.python} is not {systems[0]}'s system Python ({expected}), the only one its "
            f'archive maintains: use python = "{expected}" or another base',
        )


def _check_cuda_fields(v: Variant, fail) -> None:
    gpu_only = ("cudnn", "nccl", "compute_capabilities", "min_driver", "compat_driver_floor")
    if v.cuda is None:
        for name in gpu_only:
            if getattr(v, name) not in (None, ()):
                raise fail(name, "set on a variant without 'cuda' (a CPU image has no GPU code)")
        if v.wheel_variant != "cpu":
            raise fail("torch_index", f"a CPU variant installs whl/cpu, not {v.wheel_variant}")
        return
    for name in gpu_only:
        if getattr(v, name) in (None, ()):
            raise fail(name, f"required for a CUDA variant (cuda = {v.cuda})")
    expected = "cu" + v.cuda.replace(".", "")
    if v.wheel_variant != expected:
        raise fail("torch_index", f"{v.torch_index} does not end in /{expected} (cuda = {v.cuda})")
    if version_key(v.compat_driver_floor) > version_key(v.min_driver):
        raise fail(
            "compat_driver_floor",
            f"{v.compat_driver_floor} is above min_driver {v.min_driver}",
        )


def _check_unique(variants: list[Variant], where: str) -> None:
    # The tag embeds the name, so unique names mean unique tags.
    seen: set[str] = set()
    for v in variants:
        if v.name in seen:
            raise MatrixError(
                f"{where}: variant '{v.name}', field 'name': duplicate variant name "
                "(its image tag would overwrite the other's)"
            )
        seen.add(v.name)
