"""Resolve the GPU software stack (driver, fabric manager, CUDA, NCCL) against the compatibility data.

Rules (DESIGN.md): driver branch >= what every GPU architecture of the platform needs, open kernel
modules where an architecture requires them, CUDA <= the driver's highest CUDA, NCCL built for the
CUDA major, fabric manager version == driver version exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra.data.models import Compatibility, GpuArchitecture
from infra.spec.models import Software

Problem = tuple[str, str]


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class SoftwareVersions:
    driver_branch: int
    driver_version: str
    open_kernel_modules: bool
    fabric_manager_version: str
    cuda: str
    cuda_package_version: str
    nccl: str
    nccl_cuda_build: str


def resolve_versions(
    wanted: Software, architectures: Iterable[GpuArchitecture], data: Compatibility, root: str
) -> tuple[SoftwareVersions | None, list[Problem]]:
    problems: list[Problem] = []
    path = f"{root}.software"
    archs = sorted(set(architectures))
    support = {a.architecture: a for a in data.architectures}
    needed_branch = max((support[a].min_driver_branch for a in archs), default=0)

    branch = wanted.driver_branch
    if branch is None and wanted.driver_version:
        branch = int(wanted.driver_version.split(".")[0])
    if branch is None:
        branch = data.default_driver_branch
        if branch < needed_branch:
            branch = min((d.branch for d in data.drivers if d.branch >= needed_branch), default=branch)
    driver = next((d for d in data.drivers if d.branch == branch), None)
    if driver is None:
        known = ", ".join(str(d.branch) for d in data.drivers)
        return None, [(f"{path}.driver_branch", f"unknown driver branch {branch}; known: {known}")]
    if branch < needed_branch:
        blockers = [a for a in archs if support[a].min_driver_branch > branch]
        problems.append(
            (
                f"{path}.driver_branch",
                f"branch {branch} does not support {', '.join(blockers)} GPUs; use {needed_branch} or newer",
            )
        )
    driver_version = wanted.driver_version or driver.version
    if not driver_version.startswith(f"{branch}."):
        problems.append((f"{path}.driver_version", f"{driver_version} is not on driver branch {branch}"))

    modules = {support[a].open_kernel_modules for a in archs}
    if "required" in modules and "unsupported" in modules:
        problems.append(
            (path, f"GPU architectures {', '.join(archs)} need different kernel modules; split them")
        )
    open_modules = "unsupported" not in modules

    fabric_manager = wanted.fabric_manager or driver_version
    if fabric_manager != driver_version:
        problems.append(
            (
                f"{path}.fabric_manager",
                f"fabric manager {fabric_manager} must equal the driver version {driver_version} exactly "
                "(nv-fabricmanager refuses to start otherwise); omit it to follow the driver",
            )
        )

    usable_cuda = [c for c in data.cuda if version_tuple(c.version) <= version_tuple(driver.max_cuda)]
    cuda_version = wanted.cuda or (
        max(usable_cuda, key=lambda c: version_tuple(c.version)).version if usable_cuda else driver.max_cuda
    )
    cuda = next((c for c in data.cuda if c.version == cuda_version), None)
    if cuda is None:
        known = ", ".join(c.version for c in data.cuda)
        problems.append((f"{path}.cuda", f"unknown CUDA {cuda_version}; known: {known}"))
    elif version_tuple(cuda.version) > version_tuple(driver.max_cuda):
        problems.append(
            (
                f"{path}.cuda",
                f"CUDA {cuda.version} needs a newer driver than branch {branch} "
                f"(supports up to {driver.max_cuda})",
            )
        )
    if cuda is None or problems:
        return None, problems

    def nccl_build(release_builds: list[str]) -> str | None:
        """The exact CUDA build if published, else the newest build of the same CUDA major the driver runs."""
        if cuda.version in release_builds:
            return cuda.version
        same_major = [
            b
            for b in release_builds
            if b.split(".")[0] == cuda.version.split(".")[0]
            and version_tuple(b) <= version_tuple(driver.max_cuda)
        ]
        return max(same_major, key=version_tuple) if same_major else None

    if wanted.nccl:
        nccl = next((n for n in data.nccl if n.version == wanted.nccl), None)
        if nccl is None:
            known = ", ".join(n.version for n in data.nccl)
            return None, [(f"{path}.nccl", f"unknown NCCL {wanted.nccl}; known: {known}")]
    else:
        candidates = [n for n in data.nccl if nccl_build(n.cuda_builds)]
        nccl = max(candidates, key=lambda n: version_tuple(n.version)) if candidates else None
    build = nccl_build(nccl.cuda_builds) if nccl else None
    if nccl is None or build is None:
        builds = ", ".join(nccl.cuda_builds) if nccl else "none"
        return None, [
            (
                f"{path}.nccl",
                f"no NCCL {wanted.nccl or ''} build for CUDA {cuda.version} (builds: {builds}); "
                "pick an NCCL release built for this CUDA major",
            )
        ]
    return SoftwareVersions(
        driver_branch=branch,
        driver_version=driver_version,
        open_kernel_modules=open_modules,
        fabric_manager_version=fabric_manager,
        cuda=cuda.version,
        cuda_package_version=cuda.package_version,
        nccl=nccl.version,
        nccl_cuda_build=build,
    ), []
