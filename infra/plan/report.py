"""The offline plan: what the program declares, what each pool costs, storage against GPU demand, budget."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.data.load import compatibility
from infra.data.packages import package_facts
from infra.plan.record import Recording, record
from infra.platform.kernels import kernels_outside_range
from infra.platform.package_set import resting_facts
from infra.platform.resolve import ResolvedPlatform
from infra.policy.check import verdicts_for
from infra.policy.rules.service_costs import ServiceCost, service_costs, total_usd_per_hour
from infra.policy.settings import PolicyConfig
from infra.policy.view import from_recorded


@dataclass(frozen=True)
class PoolLine:
    name: str
    role: str
    instance_type: str
    gpu_model: str
    nodes_min: int
    nodes_max: int
    gpus_per_node: int
    gpus: int
    capacity: str
    node_usd_per_hour: float
    usd_per_hour: float
    on_demand_usd_per_hour: float


@dataclass(frozen=True)
class StorageLine:
    kind: str
    training_gpus: int
    demand_gbps: float
    supply_gbps: float | None
    capacity_gib: int | None
    per_unit_mbps: int | None
    meets_demand: bool | None


@dataclass(frozen=True)
class BudgetLine:
    gpus: int
    max_gpus: int
    usd_per_hour: float
    max_usd_per_hour: float

    @property
    def within(self) -> bool:
        return self.gpus <= self.max_gpus and self.usd_per_hour <= self.max_usd_per_hour


@dataclass
class PlanReport:
    stack: str
    backend: str
    source: str
    resources_by_type: dict[str, int]
    resources: list[dict[str, Any]]
    pools: list[PoolLine]
    storage: StorageLine
    budget: BudgetLine
    software: dict[str, Any]
    outputs: dict[str, Any]
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    # Packages the nodes will install whose version was never seen in the real repository index.
    unverified_facts: list[dict[str, Any]] = field(default_factory=list)
    # What the plan accepts but an operator must know (a kernel outside the driver's known range).
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["budget"]["within"] = self.budget.within
        return data


def _pool_lines(platform: ResolvedPlatform) -> list[PoolLine]:
    return [
        PoolLine(
            name=p.name,
            role=p.role,
            instance_type=p.node_type.name,
            gpu_model=p.node_type.gpu.model if p.node_type.gpu else "-",
            nodes_min=p.spec.min_nodes,
            nodes_max=p.spec.max_nodes,
            gpus_per_node=p.gpus_per_node,
            gpus=p.max_gpus,
            capacity=p.spec.capacity,
            node_usd_per_hour=p.node_usd_per_hour,
            usd_per_hour=p.max_usd_per_hour,
            on_demand_usd_per_hour=p.on_demand_usd_per_hour,
        )
        for p in platform.pools
    ]


def _storage_line(platform: ResolvedPlatform) -> StorageLine:
    layout = platform.lustre_layout
    return StorageLine(
        kind=platform.spec.storage.parallel_fs.kind,
        training_gpus=platform.training_gpus,
        demand_gbps=platform.storage_demand_gbps,
        supply_gbps=round(layout.aggregate_gbps, 3) if layout else None,
        capacity_gib=layout.capacity_gib if layout else None,
        per_unit_mbps=layout.per_unit_mbps if layout else None,
        meets_demand=layout.meets_demand if layout else None,
    )


def recorded_services(recording: Recording) -> list[ServiceCost]:
    return service_costs(from_recorded(r) for r in recording.resources)


def full_size_usd_per_hour(platform: ResolvedPlatform, recording: Recording | None = None) -> float:
    """The stack's cost per hour at full size, the one figure `plan`, `plan --base` and `stacks` show: the
    pools at full size plus the services (EKS, NAT gateway, FSx) the program declares (recorded here when
    no recording is given)."""
    services = recorded_services(recording or record(platform))
    return round(platform.max_usd_per_hour + total_usd_per_hour(services), 2)


def plan_warnings(platform: ResolvedPlatform) -> list[str]:
    software = platform.software
    if software.os_release is None or not any(p.node_type.gpu for p in platform.pools):
        return []
    outside = kernels_outside_range(
        compatibility(), package_facts(), software.os_release, software.driver_branch, software.driver_version
    )
    warnings = [k.message(software.driver_version, software.os_release) for k in outside]
    return warnings


def build_report(
    platform: ResolvedPlatform, recording: Recording | None = None, config: PolicyConfig | None = None
) -> PlanReport:
    recording = recording or record(platform)
    budget = platform.spec.budget
    services = recorded_services(recording)
    return PlanReport(
        stack=platform.name,
        backend=platform.spec.backend,
        source=str(platform.source),
        resources_by_type=dict(sorted(Counter(r.type for r in recording.resources).items())),
        resources=[{"type": r.type, "name": r.name, "parent": r.parent_name} for r in recording.resources],
        pools=_pool_lines(platform),
        storage=_storage_line(platform),
        budget=BudgetLine(
            gpus=platform.total_gpus,
            max_gpus=budget.max_gpus,
            usd_per_hour=full_size_usd_per_hour(platform, recording),
            max_usd_per_hour=budget.max_hourly_usd,
        ),
        software=asdict(platform.software),
        outputs=recording.outputs,
        verdicts=[v.to_dict() for v in verdicts_for(platform, recording, config)],
        services=[asdict(c) for c in services],
        unverified_facts=[
            {"package": f.package, "version": f.version, "accepted": f.accepted}
            for f in resting_facts(package_facts(), str(platform.software.os_release), platform.software)
            if not f.verified
        ],
        warnings=plan_warnings(platform),
    )
