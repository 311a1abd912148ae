"""The package-repository facts (infra/data/packages.yaml): OS releases and the real packages they carry.

Two consumers are generated from it, so neither can invent a package: the roles' per-release facts
(`roles/nvidia_common/vars/releases.yml`, by `scripts/generate-role-facts.py`) and the test fixture
repository (`scripts/build-fixture-repo.py`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.data.load import DATA_DIR, load_data_file
from infra.data.node_ansible import node_ansible_facts

PACKAGES_FILE = DATA_DIR / "packages.yaml"

ReleaseId = Literal["debian12", "debian13", "ubuntu2204", "ubuntu2404", "rhel9"]
Repository = Literal["cuda", "container-toolkit", "distro"]
Component = Literal[
    "driver",
    "fabric_manager",
    "cuda",
    "nccl",
    "dcgm",
    "dcgm_exporter",
    "container_toolkit",
    "efa",
    "slurm",
    "rdma",
    "kernel",
]
# The NVIDIA repositories the GPU roles install from (the distribution's own archive is the node's).
NVIDIA_REPOSITORIES: tuple[Repository, ...] = ("cuda", "container-toolkit")

# The releases the roles support, and how each is tested. RHEL 9 is in the facts but not here: no RPM
# repository is reachable from the test machines, so no test exercises an RPM install.
SUPPORTED_RELEASES: dict[str, str] = {
    "debian12": "Molecule scenarios on a Debian 12 image (packages from the fixture built from these facts)",
    "debian13": "Molecule scenarios on a Debian 13 image (GPU roles: preflight against these facts)",
    "ubuntu2204": "contract tests: the roles' package names and versions against these facts",
    "ubuntu2404": "contract tests: the roles' package names and versions against these facts",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sourced(_Strict):
    verified: bool = Field(description="seen in the repository index itself (false: inferred, see source)")
    source: str = Field(min_length=8)
    as_of: dt.date


MpiPlugin = Literal["pmix", "pmi2", "cray_shasta", "none"]
# MpiDefault, best first: PMIx where the release's Slurm has the plugin, else PMI-2 (Slurm builds it with
# no outside library), else none.
MPI_PREFERENCE: tuple[MpiPlugin, ...] = ("pmix", "pmi2", "none")


class SlurmFacts(_Strict):
    version: str | None
    pmix_plugin_package: str | None
    nvml_plugin_package: str | None
    mpi_plugins: list[MpiPlugin] = Field(
        default_factory=list,
        description="the mpi/* plugins the release's Slurm packages ship (srun --mpi=list)",
    )

    @model_validator(mode="after")
    def _pmix_agrees(self) -> SlurmFacts:
        if ("pmix" in self.mpi_plugins) != (self.pmix_plugin_package is not None):
            raise ValueError("mpi_plugins lists pmix exactly when pmix_plugin_package names its package")
        return self

    @property
    def mpi_default(self) -> MpiPlugin | None:
        """The MpiDefault of the release's Slurm: the first of MPI_PREFERENCE it ships (None: no facts)."""
        return next((p for p in MPI_PREFERENCE if p in self.mpi_plugins), None)


class DriverPackages(_Strict):
    """The packages the gpu_driver role installs for one kernel module flavour, the kernel module package
    first; `{branch}` stands for the driver branch (Ubuntu's names carry it, Debian's do not)."""

    open: list[str] = Field(min_length=1)
    proprietary: list[str] = Field(min_length=1)

    def names(self, branch: int, open_modules: bool) -> list[str]:
        return [n.replace("{branch}", str(branch)) for n in (self.open if open_modules else self.proprietary)]


class Release(_Sourced):
    id: ReleaseId
    family: Literal["debian", "ubuntu", "rhel"]
    name: str
    distribution: str | None = None
    distributions: list[str] = Field(default_factory=list)
    version: str
    cuda_repo: str | None
    # The repository's signing key file: a release without one would fetch `<repo>/None`.
    cuda_repo_key: str = Field(pattern=r"^[0-9A-Fa-f]{8}\.pub$")
    version_revision: str
    kernel_headers: str = Field(pattern=r"\{kernel\}")
    kernel_headers_by_kernel_flavour: dict[str, str] = Field(default_factory=dict)
    ofi_nccl_libdir: str
    aws_image_ssm_parameter: str | None = Field(
        None, description="public SSM parameter of the release's plain AMI (None: no AWS image)"
    )
    driver_packages: DriverPackages
    slurm: SlurmFacts | None = None

    @property
    def ansible_distributions(self) -> list[str]:
        return self.distributions or ([self.distribution] if self.distribution else [])


class Package(_Sourced):
    name: str
    repository: Repository
    component: Component
    releases: list[ReleaseId] = Field(min_length=1)
    versions: list[str]
    depends: list[str] = Field(default_factory=list)
    accepted: str | None = Field(
        None,
        description="unverified facts only: why a shipped stack may rest on it "
        "(infra/platform/package_set.py)",
    )

    @model_validator(mode="after")
    def _accepted_only_unverified(self) -> Package:
        if self.accepted and self.verified:
            raise ValueError(f"{self.name}: `accepted` explains an unverified fact; this one is verified")
        return self

    def depends_for(self, version: str) -> list[str]:
        return [d.replace("{version}", version) for d in self.depends]


class EfaInstallerRelease(_Strict):
    """One EFA installer release and the aws-ofi-nccl plugin it installs."""

    version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    released: dt.date
    aws_ofi_nccl: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    nccl_supported: str = Field(
        pattern=r"^\d+\.\d+\.\d+$", description="the newest NCCL the plugin release names as supported"
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description=(
            "the tarball's sha256 as read at a trusted source (None: not recorded; the role checks AWS's "
            "signature either way)"
        ),
    )
    plugin: Literal["multiarch", "lib"] = Field(
        description=(
            "multiarch: <release's ofi_nccl_libdir>/libnccl-net.so (before 1.44.0); lib: "
            "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so (lib64 on RPM releases)"
        )
    )

    def plugin_path(self, release: Release) -> str:
        """Where this release puts the plugin on the OS release."""
        if self.plugin == "multiarch":
            return f"{release.ofi_nccl_libdir}/libnccl-net.so"
        libdir = "lib64" if release.family == "rhel" else "lib"
        return f"/opt/amazon/ofi-nccl/{libdir}/libnccl-net-ofi.so"


class EfaInstaller(_Sourced):
    url: str = Field(pattern=r"\{version\}")
    releases: list[EfaInstallerRelease] = Field(min_length=1)

    @property
    def versions(self) -> list[str]:
        return [r.version for r in self.releases]

    def release(self, version: str) -> EfaInstallerRelease | None:
        return next((r for r in self.releases if r.version == version), None)


class Gdrcopy(_Sourced):
    """The GDRCopy release the RDMA pools' nodes build (roles/rdma), pinned to its tag's commit."""

    version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?$")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="the commit the release tag names")
    repository: str = Field(min_length=8)
    cuda_majors: list[int] = Field(min_length=1, description="CUDA majors the release supports")
    architectures: list[str] = Field(min_length=1, description="GPU architectures the release supports")


class PackageFacts(_Strict):
    releases: list[Release]
    packages: list[Package]
    efa_installer: EfaInstaller
    gdrcopy: Gdrcopy

    @model_validator(mode="after")
    def _releases_known(self) -> PackageFacts:
        known = {r.id for r in self.releases}
        if len(known) != len(self.releases):
            raise ValueError("release ids must be unique")
        return self

    def release(self, release_id: str) -> Release:
        return next(r for r in self.releases if r.id == release_id)

    def packages_of(self, release_id: str, repositories: tuple[Repository, ...]) -> Iterator[Package]:
        return (p for p in self.packages if release_id in p.releases and p.repository in repositories)

    def offered(self, release_id: str, repository: Repository) -> dict[str, set[str]]:
        """Package name -> every version string the facts say the repository carries for the release."""
        result: dict[str, set[str]] = {}
        for package in self.packages_of(release_id, (repository,)):
            result.setdefault(package.name, set()).update(package.versions)
        return result


@cache
def package_facts() -> PackageFacts:
    return load_data_file(PACKAGES_FILE, PackageFacts)


def role_release_facts(facts: PackageFacts) -> dict[str, Any]:
    """What the roles need per release: how to recognise it, repository paths, per-host package patterns,
    and every NVIDIA package name with the versions published for it."""
    releases: dict[str, Any] = {}
    for release in facts.releases:
        if release.id not in SUPPORTED_RELEASES:
            continue
        published: dict[str, list[str]] = {}
        for package in facts.packages_of(release.id, NVIDIA_REPOSITORIES):
            published.setdefault(package.name, [])
            published[package.name] = sorted(set(published[package.name]) | set(package.versions))
        releases[release.id] = {
            "name": release.name,
            "family": release.family,
            "distributions": release.ansible_distributions,
            "version": release.version,
            "cuda_repo": release.cuda_repo,
            "cuda_repo_key": release.cuda_repo_key,
            "kernel_headers": release.kernel_headers,
            "kernel_headers_by_kernel_flavour": dict(release.kernel_headers_by_kernel_flavour),
            "ofi_nccl_libdir": release.ofi_nccl_libdir,
            "driver_packages": release.driver_packages.model_dump(),
            "published": dict(sorted(published.items())),
        }
    return releases


def upstream_version(version: str) -> str:
    """'1:570.195.03-0ubuntu1' -> '570.195.03' (no epoch, no revision)."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


@dataclass(frozen=True)
class ReleaseOffer:
    """What NVIDIA's CUDA repository publishes for one OS release, as the version resolver needs it."""

    release_id: str
    release_name: str
    python: str | None  # the release's python3 (infra/data/node_ansible.yaml os_pythons)
    open_drivers: frozenset[str]  # driver versions every package of the open-module install set has
    proprietary_drivers: frozenset[str]
    cuda_releases: frozenset[str]
    nccl_builds: frozenset[tuple[str, str]]  # (NCCL version, CUDA build)
    dcgm_builds: frozenset[tuple[str, int]] = frozenset()  # (DCGM version, CUDA flavour) with core published

    def drivers(self, open_modules: bool) -> frozenset[str]:
        return self.open_drivers if open_modules else self.proprietary_drivers

    def dcgm(self, cuda_major: int) -> frozenset[str]:
        return frozenset(version for version, major in self.dcgm_builds if major == cuda_major)


def installable_drivers(facts: PackageFacts, release_id: str, open_modules: bool) -> frozenset[str]:
    """Driver versions for which every package the gpu_driver role installs is published: one package of
    the set missing a version (a dependency-free name the facts never saw) makes the install fail."""
    release = facts.release(release_id)
    offered = facts.offered(release_id, "cuda")
    candidates = {
        upstream_version(v)
        for p in facts.packages_of(release_id, ("cuda",))
        if p.component == "driver"
        for v in p.versions
    }
    return frozenset(
        version
        for version in candidates
        if all(
            version in {upstream_version(v) for v in offered.get(name, set())}
            for name in release.driver_packages.names(int(version.split(".")[0]), open_modules)
        )
    )


def release_python(release_id: str) -> str | None:
    os_python = node_ansible_facts().os_python(release_id)
    return os_python.python if os_python is not None else None


def release_offer(facts: PackageFacts, release_id: str) -> ReleaseOffer:
    nccl = frozenset(
        (v.split("-", 1)[0], v.rsplit("+cuda", 1)[1])
        for p in facts.packages_of(release_id, ("cuda",))
        if p.component == "nccl" and p.name in ("libnccl2", "libnccl")
        for v in p.versions
        if "+cuda" in v
    )
    cuda_toolkits = frozenset(
        upstream_version(v)
        for p in facts.packages_of(release_id, ("cuda",))
        if p.component == "cuda" and p.name.startswith("cuda-toolkit-")
        for v in p.versions
    )
    offered = facts.offered(release_id, "cuda")
    core = {upstream_version(v) for v in offered.get("datacenter-gpu-manager-4-core", set())}
    dcgm = frozenset(
        (upstream_version(v), int(name.rsplit("cuda", 1)[1]))
        for name, versions in offered.items()
        if name.startswith("datacenter-gpu-manager-4-cuda") and name.rsplit("cuda", 1)[1].isdigit()
        for v in versions
        if upstream_version(v) in core
    )
    return ReleaseOffer(
        release_id=release_id,
        release_name=facts.release(release_id).name,
        python=release_python(release_id),
        open_drivers=installable_drivers(facts, release_id, open_modules=True),
        proprietary_drivers=installable_drivers(facts, release_id, open_modules=False),
        cuda_releases=cuda_toolkits,
        nccl_builds=nccl,
        dcgm_builds=dcgm,
    )
