"""Typed models of the shipped data files: the GPU node catalog and the compatibility matrix.

Every entry carries where its figures come from (`source`) and when they were read (`as_of`).
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def version_tuple(version: str) -> tuple[int, ...]:
    """'2.17.7' -> (2, 17, 7); the facts hold plain dotted numbers only."""
    return tuple(int(part) for part in version.split("."))


GpuArchitecture = Literal["ampere", "ada", "hopper", "blackwell"]
NodeProvider = Literal["aws", "onprem"]
NicFabric = Literal["efa", "infiniband", "roce", "ethernet"]
GB = 10**9
GIB = 2**30


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sourced(_Strict):
    source: str = Field(min_length=8, description="URL or document the figures come from")
    as_of: dt.date = Field(description="date the source was read or published")


class GpuSpec(_Strict):
    model: str = Field(description="GPU model name, e.g. H100, L4")
    architecture: GpuArchitecture
    count: int = Field(ge=0, description="GPUs per node; 0 for CPU-only node types")
    memory_gb: int = Field(ge=0, description="memory per GPU as NVIDIA markets it, in GB (10^9 bytes)")
    nvlink: bool = False
    nvswitch: bool = Field(False, description="node has NVSwitch (needs the fabric manager)")


class NetworkSpec(_Strict):
    fabric: NicFabric
    nics: int = Field(ge=1, description="network cards usable for the fabric (EFA interfaces, IB ports)")
    gbps_per_nic: float = Field(gt=0)

    @property
    def total_gbps(self) -> float:
        return self.nics * self.gbps_per_nic


class PriceSpec(Sourced):
    on_demand_usd_per_hour: float = Field(ge=0)
    spot_discount: float | None = Field(
        None, ge=0, lt=1, description="typical spot discount as a fraction of on-demand; None where no spot"
    )
    region: str | None = None


class NodeType(Sourced):
    name: str
    provider: NodeProvider
    family: str = Field(description="instance family or hardware class, e.g. p5, g6e, hgx")
    vcpus: int = Field(ge=1)
    memory_gib: int = Field(ge=1)
    gpu: GpuSpec | None = None
    network: NetworkSpec
    price: PriceSpec

    @property
    def gpu_count(self) -> int:
        return self.gpu.count if self.gpu else 0

    @property
    def gpu_memory_gib(self) -> float:
        """Memory per GPU in GiB (binary), from the marketed decimal GB: what sizing compares with."""
        return self.gpu.memory_gb * GB / GIB if self.gpu else 0.0

    @property
    def spot_usd_per_hour(self) -> float | None:
        if self.price.spot_discount is None:
            return None
        return round(self.price.on_demand_usd_per_hour * (1 - self.price.spot_discount), 4)


class GpuModelFigures(Sourced):
    """What placement compares GPU models on (per GPU, NVIDIA's dense figures: datasheets quote Tensor
    throughput with sparsity, twice the dense figure)."""

    model: str
    bf16_dense_tflops: float | None = Field(
        None, gt=0, description="dense BF16 Tensor Core TFLOPS; None where no source gives it"
    )
    memory_bandwidth_gbps: float = Field(gt=0, description="GPU memory bandwidth, GB/s")
    fp8_dense_tflops: float | None = Field(
        None, gt=0, description="dense FP8 Tensor Core TFLOPS; None where the GPU has no FP8 (A100)"
    )
    tf32_dense_tflops: float | None = Field(None, gt=0, description="dense TF32 Tensor Core TFLOPS (fp32)")
    nvlink_gbps: float | None = Field(
        None, gt=0, description="NVLink bandwidth per GPU, GB/s, both directions; None without NVLink"
    )
    pcie_gbps: float | None = Field(
        None, gt=0, description="PCIe bandwidth to the host, GB/s, both directions"
    )
    figures_source: str | None = Field(
        None, description="where the precision and interconnect figures were read, where not `source`"
    )


class Catalog(_Strict):
    node_types: list[NodeType]
    gpu_models: list[GpuModelFigures] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> Catalog:
        seen: set[str] = set()
        for node in self.node_types:
            if node.name in seen:
                raise ValueError(f"node type {node.name!r} is listed twice")
            seen.add(node.name)
        models = [g.model for g in self.gpu_models]
        if len(models) != len(set(models)):
            raise ValueError(f"a GPU model is listed twice in gpu_models: {models}")
        missing = sorted({n.gpu.model for n in self.node_types if n.gpu} - set(models))
        if self.gpu_models and missing:
            raise ValueError(f"gpu_models has no figures for {missing}: every node type's GPU needs them")
        return self

    def gpu_figures(self, model: str) -> GpuModelFigures | None:
        return next((g for g in self.gpu_models if g.model == model), None)

    def get(self, name: str) -> NodeType | None:
        return next((n for n in self.node_types if n.name == name), None)

    def names(self, provider: NodeProvider | None = None) -> list[str]:
        return sorted(n.name for n in self.node_types if provider is None or n.provider == provider)


class ArchitectureSupport(Sourced):
    architecture: GpuArchitecture
    min_driver_branch: int
    open_kernel_modules: Literal["required", "recommended", "unsupported"]
    min_cuda: str = Field(
        pattern=r"^\d+\.\d+$",
        description="oldest CUDA whose toolkit builds native code (cubins) for the architecture",
    )


class DcgmRelease(Sourced):
    version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    cuda_majors: list[int] = Field(
        min_length=1, description="the datacenter-gpu-manager-4-cudaN flavours shipped"
    )
    exporter: str = Field(
        pattern=r"^\d+\.\d+\.\d+$",
        description="the dcgm-exporter release NVIDIA pairs with it (its image tag <dcgm>-<exporter>)",
    )


class GpuModelDriver(Sourced):
    """The first production driver that supports a GPU model (H200 needs a newer one than H100, its
    architecture's first): the plan refuses an older one for a pool of that GPU."""

    model: str
    min_driver_version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?$")


class DriverBranch(Sourced):
    branch: int
    version: str = Field(description="full driver version pinned for this branch, e.g. 570.195.03")
    max_cuda: str = Field(pattern=r"^\d+\.\d+$", description="highest CUDA toolkit this driver supports")
    lifecycle: Literal["production", "lts", "new-feature"] = "production"
    end_of_life: dt.date = Field(
        description=(
            "first day NVIDIA no longer supports the branch (NVIDIA names a month: the day after it); for "
            "branches NVIDIA lists as ended without a date, the day that list was read"
        )
    )

    def supported_on(self, day: dt.date) -> bool:
        return day < self.end_of_life

    @model_validator(mode="after")
    def _version_in_branch(self) -> DriverBranch:
        if not self.version.startswith(f"{self.branch}."):
            raise ValueError(f"driver version {self.version} is not on branch {self.branch}")
        return self


class CudaRelease(Sourced):
    version: str = Field(pattern=r"^\d+\.\d+$")
    package_version: str = Field(description="full toolkit version used in package pins, e.g. 12.8.1")


class NcclRelease(Sourced):
    version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    cuda_builds: list[str] = Field(
        min_length=1, description="CUDA major.minor builds published, e.g. ['12.8', '13.0']"
    )


class CudaMajorDriver(Sourced):
    """Minimum driver branch for binaries built with any toolkit of a CUDA major (minor version compat)."""

    cuda_major: int = Field(ge=11)
    min_driver_branch: int


class TorchRelease(Sourced):
    version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    default_cuda: str = Field(
        pattern=r"^\d+\.\d+$", description="CUDA build of the wheel `pip install torch` gets from PyPI"
    )
    nccl: str = Field(
        pattern=r"^\d+\.\d+\.\d+$",
        description="the NCCL the wheel requires (nvidia-nccl-cuNN==X): what its jobs load, not the node's",
    )

    @property
    def cuda_major(self) -> int:
        return int(self.default_cuda.split(".")[0])


class ServingEngineRelease(Sourced):
    engine: Literal["vllm"]
    version: str = Field(pattern=r"^\d+\.\d+\.\d+(\.\d+)?$")
    torch: str = Field(pattern=r"^\d+\.\d+\.\d+$", description="the torch version the release pins (==)")
    python_min: str = Field(pattern=r"^3\.\d+$", description="Requires-Python lower bound (>=)")
    python_below: str = Field(pattern=r"^3\.\d+$", description="Requires-Python upper bound (<)")

    def runs_on_python(self, python: str) -> bool:
        return version_tuple(self.python_min) <= version_tuple(python) < version_tuple(self.python_below)


class DriverKernelRange(Sourced):
    """Driver versions of a branch from `driver_from` on build their DKMS module on kernels below
    `kernel_below` as far as is known: a newer kernel series is outside the known range (a driver that
    predates a kernel series is not expected to build on it)."""

    branch: int
    driver_from: str = Field(pattern=r"^\d+\.\d+(\.\d+)?$")
    kernel_below: str = Field(pattern=r"^\d+\.\d+$", description="the first kernel series not known to build")


class Compatibility(_Strict):
    architectures: list[ArchitectureSupport]
    drivers: list[DriverBranch]
    cuda: list[CudaRelease]
    nccl: list[NcclRelease]
    default_driver_branch: int
    cuda_major_drivers: list[CudaMajorDriver] = Field(default_factory=list)
    torch: list[TorchRelease] = Field(default_factory=list)
    serving_engines: list[ServingEngineRelease] = Field(default_factory=list)
    gpu_models: list[GpuModelDriver] = Field(default_factory=list)
    dcgm: list[DcgmRelease] = Field(default_factory=list)
    driver_kernels: list[DriverKernelRange] = Field(default_factory=list)

    def min_driver_branch_for(self, cuda_major: int) -> int | None:
        """The oldest driver branch that runs binaries of a CUDA major (minor version compatibility)."""
        return next(
            (m.min_driver_branch for m in self.cuda_major_drivers if m.cuda_major == cuda_major), None
        )

    @model_validator(mode="after")
    def _serving_chain_known(self) -> Compatibility:
        torch = {t.version: t for t in self.torch}
        majors = {m.cuda_major for m in self.cuda_major_drivers}
        for engine in self.serving_engines:
            pinned = torch.get(engine.torch)
            if pinned is None:
                raise ValueError(f"{engine.engine} {engine.version} pins torch {engine.torch}: not listed")
            if pinned.cuda_major not in majors:
                raise ValueError(f"torch {pinned.version}: CUDA {pinned.cuda_major} has no minimum driver")
        return self

    @model_validator(mode="after")
    def _default_known(self) -> Compatibility:
        default = next((d for d in self.drivers if d.branch == self.default_driver_branch), None)
        if default is None:
            raise ValueError(f"default_driver_branch {self.default_driver_branch} is not among drivers")
        if default.lifecycle == "new-feature":
            raise ValueError(f"default_driver_branch {default.branch} is a new-feature branch")
        return self

    def driver(self, branch: int) -> DriverBranch | None:
        return next((d for d in self.drivers if d.branch == branch), None)

    def supported_branches(self, day: dt.date) -> list[DriverBranch]:
        return sorted((d for d in self.drivers if d.supported_on(day)), key=lambda d: d.branch)


ImageKind = Literal["plain", "baked"]


class NodeBoot(Sourced):
    image: ImageKind = Field(
        description="plain: the OS image, the roles install at boot; baked: a node image"
    )
    seconds: int = Field(ge=1, description="launch to node in service")


class BootTimes(_Strict):
    node_boot: list[NodeBoot]

    def seconds(self, image: ImageKind) -> int:
        return next(b.seconds for b in self.node_boot if b.image == image)

    @model_validator(mode="after")
    def _every_kind(self) -> BootTimes:
        if {b.image for b in self.node_boot} != {"plain", "baked"}:
            raise ValueError("node_boot needs exactly one entry for plain and for baked images")
        return self


class HourlyService(Sourced):
    usd_per_hour: float = Field(ge=0)


class LustrePrices(Sourced):
    usd_per_gb_month_by_mbps_per_tib: dict[int, float] = Field(min_length=1)


class ServicePrices(_Strict):
    """Hourly prices of the services an aws stack runs besides its instances (service_prices.yaml)."""

    hours_per_month: int = Field(gt=0)
    eks_cluster: HourlyService
    nat_gateway: HourlyService
    public_ipv4_address: HourlyService
    fsx_lustre_persistent2_ssd: LustrePrices
