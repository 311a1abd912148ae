"""What an aws stack pays by the hour besides its instances, counted from the resources its program
declares (EKS control planes, NAT gateways and their public addresses, FSx for Lustre storage), priced
from infra/data/service_prices.yaml. Traffic-based charges are not counted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra.data.load import service_prices
from infra.policy.rules.resource_types import EKS_CLUSTER, ELASTIC_IP, LUSTRE, NAT_GATEWAY
from infra.policy.view import ResourceView

NOT_COUNTED = "traffic-based charges (NAT data processing, data transfer, S3 requests) are not counted"


@dataclass(frozen=True)
class ServiceCost:
    resource: str
    what: str
    usd_per_hour: float


def service_costs(resources: Iterable[ResourceView]) -> list[ServiceCost]:
    prices = service_prices()
    costs = []
    for resource in resources:
        if resource.type == EKS_CLUSTER:
            costs.append(ServiceCost(resource.name, "EKS control plane", prices.eks_cluster.usd_per_hour))
        elif resource.type == NAT_GATEWAY:
            costs.append(ServiceCost(resource.name, "NAT gateway", prices.nat_gateway.usd_per_hour))
        elif resource.type == ELASTIC_IP:
            costs.append(
                ServiceCost(resource.name, "public IPv4 address", prices.public_ipv4_address.usd_per_hour)
            )
        elif resource.type == LUSTRE:
            costs.append(_lustre(resource))
    return costs


def _lustre(resource: ResourceView) -> ServiceCost:
    prices = service_prices()
    tiers = prices.fsx_lustre_persistent2_ssd.usd_per_gb_month_by_mbps_per_tib
    capacity = float(resource.props.get("storageCapacity") or 0)
    tier = int(resource.props.get("perUnitStorageThroughput") or min(tiers))
    per_gb_month = tiers.get(tier, max(tiers.values()))
    return ServiceCost(
        resource.name,
        f"FSx for Lustre, {capacity:.0f} GiB at {tier} MB/s/TiB",
        round(capacity * per_gb_month / prices.hours_per_month, 4),
    )


def total_usd_per_hour(costs: Iterable[ServiceCost]) -> float:
    return round(sum(c.usd_per_hour for c in costs), 2)
