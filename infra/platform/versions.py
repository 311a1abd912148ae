"""Resolve the GPU software stack (driver, fabric manager, CUDA, NCCL, serving engine) against the data.

Rules (DESIGN.md): driver branch >= what every GPU architecture of the platform needs, open kernel
modules where an architecture requires them, CUDA <= the driver's highest CUDA, NCCL built for the
CUDA major, fabric manager version == driver version exactly.

Serving engine (vLLM): the release pins a torch; the torch wheel PyPI serves is built for one CUDA
major; binaries of that major need a minimum driver branch. With the engine version left open, the
newest release that runs on the resolved driver is chosen; with it pinned and the driver left open,
the driver branch is raised to what it needs; pinned against an explicit older driver, the stack is
rejected naming both fields.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from infra.data.models import Compatibility, GpuArchitecture, ServingEngineRelease, version_tuple
from infra.data.packages import ReleaseOffer
from infra.platform.efa import EfaStack
from infra.platform.gdrcopy import GdrcopyBuild
from infra.spec.models import Serving, Software

Problem = tuple[str, str]


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
    driver_cuda_major: int = 12  # the CUDA major the driver reports: DCGM's flavour follows it
    dcgm_version: str | None = None
    dcgm_exporter_version: str | None = None  # the exporter release paired with dcgm_version
    serving: ServingVersions | None = None
    os_release: str | None = None
    # The NCCL training jobs load: the training environment's torch wheel's (None: no shared environment,
    # jobs bring their own), and the torch release it comes with.
    jobs_nccl: str | None = None
    jobs_torch: str | None = None
    efa: EfaStack | None = None  # fabric efa: the installer whose plugin supports both NCCLs
    gdrcopy: GdrcopyBuild | None = None  # RDMA fabrics: what the training GPU nodes build (roles/rdma)


@dataclass(frozen=True)
class ServingVersions:
    """A serving engine release and the chain that decides which driver it runs on."""

    engine: str
    version: str
    torch: str
    torch_cuda: str
    min_driver_branch: int


def serving_chain(release: ServingEngineRelease, data: Compatibility) -> ServingVersions:
    torch = next(t for t in data.torch if t.version == release.torch)
    minimum = data.min_driver_branch_for(torch.cuda_major)
    assert minimum is not None  # the Compatibility model checks every serving chain is complete
    return ServingVersions(
        engine=release.engine,
        version=release.version,
        torch=torch.version,
        torch_cuda=torch.default_cuda,
        min_driver_branch=minimum,
    )


@dataclass(frozen=True)
class ServingHost:
    """What the serving nodes impose on an engine release besides the driver branch."""

    python: str | None = None  # the OS release's python3 (the engine's venv is built on it)
    min_cuda: str | None = None  # the newest architecture's oldest CUDA with native kernels for it


def _host_blockers(chain: ServingVersions, release: ServingEngineRelease, host: ServingHost) -> list[str]:
    blockers = []
    if host.python is not None and not release.runs_on_python(host.python):
        blockers.append(
            f"it requires Python >= {release.python_min}, < {release.python_below} and the nodes' OS release "
            f"has {host.python}"
        )
    if host.min_cuda is not None and version_tuple(chain.torch_cuda) < version_tuple(host.min_cuda):
        blockers.append(
            f"its torch {chain.torch} wheel is built for CUDA {chain.torch_cuda}, without native kernels "
            f"for the serving GPUs (they need CUDA >= {host.min_cuda})"
        )
    return blockers


def _resolve_serving(
    serving: Serving, branch: int, driver_open: bool, data: Compatibility, root: str, host: ServingHost
) -> tuple[ServingVersions | None, list[Problem]]:
    """The engine release for the resolved driver branch (None for engines outside the data)."""
    if serving.engine != "vllm":
        return None, []
    path = f"{root}.serving.engine_version"
    releases = [r for r in data.serving_engines if r.engine == serving.engine]
    chains = {r.version: serving_chain(r, data) for r in releases}
    fits = [
        chains[r.version]
        for r in releases
        if chains[r.version].min_driver_branch <= branch and not _host_blockers(chains[r.version], r, host)
    ]
    if serving.engine_version is None:
        if not fits:
            return None, [
                (
                    path,
                    f"no vLLM release in the compatibility data runs on driver branch {branch} and "
                    "these nodes; known: "
                    + "; ".join(
                        f"{r.version} (driver >= {chains[r.version].min_driver_branch}"
                        + "".join(f"; {b}" for b in _host_blockers(chains[r.version], r, host))
                        + ")"
                        for r in releases
                    ),
                )
            ]
        return max(fits, key=lambda c: version_tuple(c.version)), []
    release = next((r for r in releases if r.version == serving.engine_version), None)
    if release is None:
        known = ", ".join(chains)
        return None, [(path, f"unknown vLLM {serving.engine_version}; known: {known}")]
    chain = chains[release.version]
    alternatives = ", ".join(c.version for c in fits) or "none"
    blockers = _host_blockers(chain, release, host)
    if blockers:
        return None, [
            (
                path,
                f"vLLM {chain.version} cannot serve here: {'; '.join(blockers)}. "
                f"Releases that can: {alternatives}",
            )
        ]
    if chain.min_driver_branch > branch:
        cuda_major = chain.torch_cuda.split(".")[0]
        where = "the default" if driver_open else f"set in {root}.software"
        return None, [
            (
                path,
                f"vLLM {chain.version} pins torch {chain.torch}, whose PyPI wheel is built for CUDA "
                f"{chain.torch_cuda}: it needs CUDA {cuda_major} / driver >= {chain.min_driver_branch}, but "
                f"software.driver_branch is {branch} ({where}). Raise software.driver_branch to "
                f"{chain.min_driver_branch} or newer, or pick a vLLM release that runs on {branch}: "
                f"{alternatives}",
            )
        ]
    return chain, []


def _unpublished(what: str, offer: ReleaseOffer, published: frozenset[str]) -> str:
    listed = ", ".join(sorted(published, key=version_tuple)) or "none of the versions in the data"
    return (
        f"{what} is not published for {offer.release_name} in NVIDIA's repository "
        f"(infra/data/packages.yaml lists: {listed}); pick a published version or set software.os_release "
        "to a release that has it"
    )


def resolve_versions(
    wanted: Software,
    architectures: Iterable[GpuArchitecture],
    data: Compatibility,
    root: str,
    serving: Serving | None = None,
    offer: ReleaseOffer | None = None,
    today: dt.date | None = None,
    gpu_models: Iterable[str] = (),
    serving_architectures: Iterable[GpuArchitecture] = (),
) -> tuple[SoftwareVersions | None, list[Problem]]:
    """The software set for the GPU architectures; with `offer`, only what NVIDIA's repository publishes
    for the nodes' OS release (infra/data/packages.yaml) is chosen, and pinned versions it lacks are
    rejected. A driver branch past its end of life (as of `today`) is never chosen and refused when set;
    GPU models that need a newer driver than their architecture (`gpu_models`) and the serving nodes'
    architectures and OS Python (`serving_architectures`, `offer`) narrow what is accepted."""
    problems: list[Problem] = []
    path = f"{root}.software"
    archs = sorted(set(architectures))
    support = {a.architecture: a for a in data.architectures}
    arch_branch = max((support[a].min_driver_branch for a in archs), default=0)
    driver_open = wanted.driver_branch is None and not wanted.driver_version
    # A pinned engine raises the default driver branch when the stack leaves the driver open.
    serving_branch = 0
    if driver_open and serving is not None and serving.engine == "vllm" and serving.engine_version:
        pinned = [
            serving_chain(r, data)
            for r in data.serving_engines
            if r.engine == serving.engine and r.version == serving.engine_version
        ]
        serving_branch = max((c.min_driver_branch for c in pinned), default=0)
    needed_branch = max(arch_branch, serving_branch)

    branch = wanted.driver_branch
    if branch is None and wanted.driver_version:
        branch = int(wanted.driver_version.split(".")[0])
    day = today or dt.date.today()
    supported = data.supported_branches(day)
    if branch is None:
        branch = data.default_driver_branch
        if branch < needed_branch or branch not in {d.branch for d in supported}:
            branch = min((d.branch for d in supported if d.branch >= needed_branch), default=branch)
    driver = data.driver(branch)
    if driver is None:
        known = ", ".join(str(d.branch) for d in data.drivers)
        return None, [(f"{path}.driver_branch", f"unknown driver branch {branch}; known: {known}")]
    if not driver.supported_on(day):
        pinned_version = wanted.driver_version and wanted.driver_branch is None
        field = "driver_version" if pinned_version else "driver_branch"
        alive = ", ".join(f"{d.branch} (until {d.end_of_life})" for d in supported) or "none in the data"
        problems.append(
            (
                f"{path}.{field}",
                f"driver branch {branch} is past its end of life (NVIDIA support ended before "
                f"{driver.end_of_life}: no more security or bug fixes; infra/data/compatibility.yaml). "
                f"Supported branches: {alive}",
            )
        )
    if branch < arch_branch:
        blockers = [a for a in archs if support[a].min_driver_branch > branch]
        problems.append(
            (
                f"{path}.driver_branch",
                f"branch {branch} does not support {', '.join(blockers)} GPUs; use {arch_branch} or newer",
            )
        )
    serving_versions: ServingVersions | None = None
    if serving is not None:
        serving_cudas = [support[a].min_cuda for a in set(serving_architectures)]
        host = ServingHost(
            python=offer.python if offer is not None else None,
            min_cuda=max(serving_cudas, key=version_tuple) if serving_cudas else None,
        )
        serving_versions, serving_problems = _resolve_serving(serving, branch, driver_open, data, root, host)
        problems += serving_problems
    driver_version = wanted.driver_version or driver.version
    for model in sorted(set(gpu_models)):
        need = next((m for m in data.gpu_models if m.model == model), None)
        if need is not None and version_tuple(driver_version) < version_tuple(need.min_driver_version):
            field = "driver_version" if wanted.driver_version else "driver_branch"
            remedy = (
                f"set software.driver_version to {need.min_driver_version} or later"
                if wanted.driver_version
                else f"set software.driver_branch to one whose driver is {need.min_driver_version} or later"
            )
            problems.append(
                (
                    f"{path}.{field}",
                    f"{model} GPUs need driver {need.min_driver_version} or newer, the first production "
                    "driver that supports them (infra/data/compatibility.yaml, gpu_models); driver "
                    f"{driver_version} (branch {branch}) does not: {remedy}, or leave the driver to the plan",
                )
            )

    modules = {support[a].open_kernel_modules for a in archs}
    if "required" in modules and "unsupported" in modules:
        problems.append(
            (path, f"GPU architectures {', '.join(archs)} need different kernel modules; split them")
        )
    open_modules = "unsupported" not in modules

    if not driver_version.startswith(f"{branch}."):
        problems.append((f"{path}.driver_version", f"{driver_version} is not on driver branch {branch}"))
    elif offer is not None and driver_version not in offer.drivers(open_modules):
        field = "driver_version" if wanted.driver_version else "driver_branch"
        flavour = "open" if open_modules else "proprietary"
        problems.append(
            (
                f"{path}.{field}",
                _unpublished(
                    f"driver {driver_version} (every package of its {flavour}-module install set)",
                    offer,
                    offer.drivers(open_modules),
                ),
            )
        )

    fabric_manager = wanted.fabric_manager or driver_version
    if fabric_manager != driver_version:
        problems.append(
            (
                f"{path}.fabric_manager",
                f"fabric manager {fabric_manager} must equal the driver version {driver_version} exactly "
                "(nv-fabricmanager refuses to start otherwise); omit it to follow the driver",
            )
        )

    usable_cuda = [
        c
        for c in data.cuda
        if version_tuple(c.version) <= version_tuple(driver.max_cuda)
        and (offer is None or c.package_version in offer.cuda_releases)
    ]
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
    elif archs and version_tuple(cuda.version) < max(version_tuple(support[a].min_cuda) for a in archs):
        needs = ", ".join(f"{a} >= {support[a].min_cuda}" for a in archs)
        problems.append(
            (f"{path}.cuda", f"CUDA {cuda.version} cannot build native code for these GPUs ({needs})")
        )
    elif offer is not None and cuda.package_version not in offer.cuda_releases:
        problems.append(
            (f"{path}.cuda", _unpublished(f"CUDA {cuda.package_version}", offer, offer.cuda_releases))
        )
    if cuda is None or problems:
        return None, problems

    def runs_on_driver(build: str) -> bool:
        """Minor version compatibility: a build of a CUDA major runs on any driver from that major's
        minimum branch on (NCCL links the CUDA runtime statically)."""
        minimum = data.min_driver_branch_for(int(build.split(".")[0]))
        if minimum is None:
            return version_tuple(build) <= version_tuple(driver.max_cuda)
        return branch >= minimum

    def nccl_build(nccl_version: str, release_builds: list[str]) -> str | None:
        """The toolkit's exact CUDA build if there is one, else the newest build of the same CUDA major
        that runs on the driver; with `offer`, only builds NVIDIA publishes for the OS release."""
        eligible = [
            b
            for b in release_builds
            if b.split(".")[0] == cuda.version.split(".")[0]
            and runs_on_driver(b)
            and (offer is None or (nccl_version, b) in offer.nccl_builds)
        ]
        if cuda.version in eligible:
            return cuda.version
        return max(eligible, key=version_tuple) if eligible else None

    if wanted.nccl:
        nccl = next((n for n in data.nccl if n.version == wanted.nccl), None)
        if nccl is None:
            known = ", ".join(n.version for n in data.nccl)
            return None, [(f"{path}.nccl", f"unknown NCCL {wanted.nccl}; known: {known}")]
    else:
        candidates = [n for n in data.nccl if nccl_build(n.version, n.cuda_builds)]
        nccl = max(candidates, key=lambda n: version_tuple(n.version)) if candidates else None
    build = nccl_build(nccl.version, nccl.cuda_builds) if nccl else None
    if nccl is None or build is None:
        builds = ", ".join(nccl.cuda_builds) if nccl else "none"
        published = (
            f"; NVIDIA publishes for {offer.release_name}: "
            + (", ".join(f"{v}+cuda{b}" for v, b in sorted(offer.nccl_builds)) or "none")
            if offer is not None
            else ""
        )
        return None, [
            (
                f"{path}.nccl",
                f"no NCCL {wanted.nccl or ''} build for CUDA {cuda.version} on driver branch {branch} "
                f"(builds: {builds}{published}); pick an NCCL release built for this CUDA major",
            )
        ]
    driver_cuda_major = int(driver.max_cuda.split(".")[0])
    dcgm = [
        d
        for d in data.dcgm
        if driver_cuda_major in d.cuda_majors
        and (offer is None or d.version in offer.dcgm(driver_cuda_major))
    ]
    if data.dcgm and not dcgm:
        published = ", ".join(sorted(offer.dcgm(driver_cuda_major))) if offer is not None else "n/a"
        return None, [
            (
                f"{path}.driver_branch",
                f"no DCGM release in the data ships the CUDA {driver_cuda_major} flavour driver {branch} "
                f"needs (datacenter-gpu-manager-4-cuda{driver_cuda_major}; published: {published})",
            )
        ]
    newest_dcgm = max(dcgm, key=lambda d: version_tuple(d.version)) if dcgm else None
    return SoftwareVersions(
        driver_branch=branch,
        driver_cuda_major=driver_cuda_major,
        dcgm_version=newest_dcgm.version if newest_dcgm else None,
        dcgm_exporter_version=newest_dcgm.exporter if newest_dcgm else None,
        driver_version=driver_version,
        open_kernel_modules=open_modules,
        fabric_manager_version=fabric_manager,
        cuda=cuda.version,
        cuda_package_version=cuda.package_version,
        nccl=nccl.version,
        nccl_cuda_build=build,
        serving=serving_versions,
        os_release=offer.release_id if offer is not None else None,
    ), []


def training_torch_problems(
    torch_version: str | None, driver_branch: int, data: Compatibility, root: str
) -> list[Problem]:
    """The training environment's torch must be a release the data knows, and its PyPI build's CUDA
    major must run on the nodes' driver (a newer one fails every job at `import torch` on a GPU)."""
    if torch_version is None:
        return []
    path = f"{root}.training.torch_version"
    torch = next((t for t in data.torch if t.version == torch_version), None)
    if torch is None:
        known = ", ".join(t.version for t in data.torch)
        return [(path, f"torch {torch_version} is not in infra/data/compatibility.yaml (known: {known})")]
    minimum = data.min_driver_branch_for(torch.cuda_major)
    if minimum is not None and driver_branch < minimum:
        return [
            (
                path,
                f"torch {torch_version}'s PyPI wheel is built for CUDA {torch.default_cuda}, which needs "
                f"driver branch {minimum} or newer; the nodes get {driver_branch}. Pick an older torch or a "
                "newer software.driver_branch",
            )
        ]
    return []
