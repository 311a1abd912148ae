"""Resolve a PlatformSpec against the shipped data: node types, GPU counts, prices, software versions.

The result is what every consumer reads: the Pulumi program, the policy rules, the inventory, the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from infra.data.load import catalog, compatibility
from infra.data.models import NodeProvider, NodeType
from infra.data.packages import package_facts, release_offer
from infra.errors import SpecError
from infra.errors.problems import spec_error
from infra.platform.boot_time import boot_problems
from infra.platform.efa import NcclUse, resolve_efa
from infra.platform.gdrcopy import resolve_gdrcopy
from infra.platform.serving_layout import ServingLayout, serving_layout
from infra.platform.storage import LustreLayout, fsx_lustre_layout
from infra.platform.versions import Problem, SoftwareVersions, resolve_versions, training_torch_problems
from infra.spec.defaults import os_release
from infra.spec.load import CONFIG_KEY, load_spec_file
from infra.spec.models import NodePool, PlatformSpec

_PROVIDER_FOR_BACKEND: dict[str, set[NodeProvider]] = {
    "aws": {"aws"},
    "onprem": {"onprem"},
    "local": {"aws", "onprem"},
}


@dataclass(frozen=True)
class ResolvedPool:
    spec: NodePool
    node_type: NodeType
    simulated: bool
    # Nodes that exist now, where that differs from max (a scaled local pool); None: all of them.
    running_nodes: int | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def gpus_per_node(self) -> int:
        return self.node_type.gpu_count

    @property
    def max_gpus(self) -> int:
        return self.gpus_per_node * self.spec.max_nodes

    @property
    def node_usd_per_hour(self) -> float:
        """Price of one node-hour for the pool's capacity type (reserved capacity bills at on-demand); a
        simulated node (a local container) costs nothing by the hour."""
        if self.simulated:
            return 0.0
        if self.spec.capacity == "spot" and self.node_type.spot_usd_per_hour is not None:
            return self.node_type.spot_usd_per_hour
        return self.node_type.price.on_demand_usd_per_hour

    @property
    def max_usd_per_hour(self) -> float:
        return round(self.node_usd_per_hour * self.spec.max_nodes, 2)

    @property
    def on_demand_usd_per_hour(self) -> float:
        if self.simulated:
            return 0.0
        return round(self.node_type.price.on_demand_usd_per_hour * self.spec.max_nodes, 2)

    def node_names(self) -> list[str]:
        if self.spec.hosts:
            return [h.name for h in self.spec.hosts]
        return [f"{self.name}-{index}" for index in range(self.spec.max_nodes)]

    def running_node_names(self) -> list[str]:
        names = self.node_names()
        return names if self.running_nodes is None else names[: self.running_nodes]


@dataclass(frozen=True)
class ResolvedPlatform:
    spec: PlatformSpec
    source: Path
    pools: tuple[ResolvedPool, ...]
    software: SoftwareVersions
    serving_layout: ServingLayout | None = None
    """Model-server replicas per node of the serving pool (tensor parallel, GPU groups)."""

    @property
    def name(self) -> str:
        return self.spec.name

    def pool(self, name: str) -> ResolvedPool:
        return next(p for p in self.pools if p.name == name)

    def pools_with_role(self, role: str) -> list[ResolvedPool]:
        return [p for p in self.pools if p.role == role]

    def uses_efa(self, pool: ResolvedPool) -> bool:
        """EFA interfaces on the pool's nodes: training pools of EFA node types on an efa fabric (aws)."""
        return (
            pool.role == "train" and self.spec.fabric.kind == "efa" and pool.node_type.network.fabric == "efa"
        )

    @property
    def total_gpus(self) -> int:
        return sum(p.max_gpus for p in self.pools)

    @property
    def training_gpus(self) -> int:
        return sum(p.max_gpus for p in self.pools_with_role("train"))

    @property
    def max_usd_per_hour(self) -> float:
        return round(sum(p.max_usd_per_hour for p in self.pools), 2)

    @property
    def storage_demand_gbps(self) -> float:
        return round(self.training_gpus * self.spec.storage.parallel_fs.read_gbps_per_gpu, 3)

    @property
    def lustre_layout(self) -> LustreLayout | None:
        fs = self.spec.storage.parallel_fs
        if fs.kind != "fsx-lustre":
            return None
        return fsx_lustre_layout(fs.capacity_tib, self.storage_demand_gbps)

    @property
    def controller_pool(self) -> ResolvedPool:
        wanted = self.spec.scheduler.controller_pool
        return self.pool(wanted) if wanted else self.pools_with_role("service")[0]

    @property
    def gateway_pool(self) -> ResolvedPool:
        wanted = self.spec.serving.gateway_pool if self.spec.serving else None
        return self.pool(wanted) if wanted else self.pools_with_role("service")[0]


def _resolve_pool(
    spec: PlatformSpec, index: int, pool: NodePool, problems: list[Problem]
) -> ResolvedPool | None:
    path = f"{CONFIG_KEY}.pools[{index}]"
    allowed = _PROVIDER_FOR_BACKEND[spec.backend]
    node_type = catalog().get(pool.instance_type)
    if node_type is None or node_type.provider not in allowed:
        names = [n for provider in sorted(allowed) for n in catalog().names(provider)]
        problems.append(
            (
                f"{path}.instance_type",
                f"unknown instance type {pool.instance_type!r} for backend {spec.backend}; "
                f"allowed: {', '.join(names)}",
            )
        )
        return None
    if pool.role in ("train", "infer") and node_type.gpu_count == 0:
        problems.append(
            (f"{path}.instance_type", f"{pool.instance_type} has no GPUs; a {pool.role} pool needs them")
        )
    if pool.capacity == "spot" and spec.backend == "aws" and node_type.price.spot_discount is None:
        problems.append(
            (f"{path}.capacity", f"{pool.instance_type} is not offered as spot; use on-demand or reserved")
        )
    return ResolvedPool(spec=pool, node_type=node_type, simulated=spec.backend == "local")


def image_parameter(spec: PlatformSpec) -> str:
    """The SSM parameter of the nodes' AMI on aws: the stack's, else the plain image of the nodes' OS release
    (infra/data/packages.yaml), which carries no GPU software for the roles to fight with."""
    if spec.aws.image_ssm_parameter:
        return spec.aws.image_ssm_parameter
    parameter = package_facts().release(os_release(spec)).aws_image_ssm_parameter
    if parameter is None:
        raise SpecError(
            f"{CONFIG_KEY}.aws.image_ssm_parameter: no public image is known for {os_release(spec)}; set one"
        )
    return parameter


def _with_jobs_nccl(spec: PlatformSpec, software: SoftwareVersions) -> tuple[SoftwareVersions, list[Problem]]:
    """The NCCL jobs load (the training environment's torch wheel's) and, on EFA, the installer whose plugin
    supports it and the nodes' own NCCL (infra/platform/efa.py)."""
    torch = next((t for t in compatibility().torch if t.version == spec.training.torch_version), None)
    if spec.scheduler.kind == "slurm" and torch is not None:
        software = replace(software, jobs_nccl=torch.nccl, jobs_torch=torch.version)
    if spec.fabric.kind != "efa":
        if spec.software.efa_installer is not None:
            return software, [
                (
                    f"{CONFIG_KEY}.software.efa_installer",
                    f"an EFA installer is installed on fabric kind efa only; this stack's fabric is "
                    f"{spec.fabric.kind}: remove software.efa_installer or set fabric.kind: efa",
                )
            ]
        return software, []
    uses = [NcclUse(software.nccl, "the nodes' libnccl2: nccl-tests, gpuplat validate")]
    if software.jobs_nccl is not None:
        uses.append(NcclUse(software.jobs_nccl, f"training jobs: torch {software.jobs_torch}'s wheel"))
    facts = package_facts()
    efa, problems = resolve_efa(
        facts.efa_installer,
        uses,
        spec.software.efa_installer,
        facts.release(os_release(spec)),
        f"{CONFIG_KEY}.software.efa_installer",
    )
    return replace(software, efa=efa), problems


def resolve(spec: PlatformSpec, source: Path) -> ResolvedPlatform:
    problems: list[Problem] = []
    pools = [_resolve_pool(spec, i, p, problems) for i, p in enumerate(spec.pools)]
    resolved_pools = tuple(p for p in pools if p is not None)
    architectures = [p.node_type.gpu.architecture for p in resolved_pools if p.node_type.gpu]
    offer = release_offer(package_facts(), os_release(spec))
    serving_gpus = [
        p.node_type.gpu.architecture
        for p in resolved_pools
        if p.node_type.gpu and spec.serving is not None and p.name == spec.serving.pool
    ]
    software, version_problems = resolve_versions(
        spec.software,
        architectures,
        compatibility(),
        CONFIG_KEY,
        spec.serving,
        offer,
        gpu_models=[p.node_type.gpu.model for p in resolved_pools if p.node_type.gpu],
        serving_architectures=serving_gpus,
    )
    problems += version_problems
    if software is not None and spec.backend != "local":
        problems += training_torch_problems(
            spec.training.torch_version, software.driver_branch, compatibility(), CONFIG_KEY
        )
    if software is not None:
        software, nccl_problems = _with_jobs_nccl(spec, software)
        problems += nccl_problems
        rdma_architectures = [
            p.node_type.gpu.architecture for p in resolved_pools if p.node_type.gpu and p.role == "train"
        ]
        gdrcopy, gdrcopy_problems = resolve_gdrcopy(
            package_facts().gdrcopy,
            spec.fabric.kind,
            software.driver_cuda_major,
            rdma_architectures,
            f"{CONFIG_KEY}.fabric.kind",
        )
        software = replace(software, gdrcopy=gdrcopy)
        problems += gdrcopy_problems
    problems += boot_problems(spec)
    layout: ServingLayout | None = None
    if spec.serving is not None:
        serving_pool = next((p for p in resolved_pools if p.name == spec.serving.pool), None)
        if serving_pool is not None:
            layout, layout_problems = serving_layout(
                spec.serving,
                serving_pool.node_type,
                simulated=serving_pool.simulated,
                path=f"{CONFIG_KEY}.serving",
                multi_node=spec.scheduler.kind == "kueue",
                pool_nodes=serving_pool.spec.max_nodes,
                pool_min_nodes=serving_pool.spec.min_nodes,
            )
            problems += layout_problems
    if problems or software is None:
        raise spec_error(source, problems)
    return ResolvedPlatform(
        spec=spec, source=source, pools=resolved_pools, software=software, serving_layout=layout
    )


def load_platform(path: Path, overrides: Sequence[str] = ()) -> ResolvedPlatform:
    return resolve(load_spec_file(path, overrides), path)
