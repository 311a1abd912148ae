"""What the local platform looks like now: nodes, Slurm partitions and GPUs, services, endpoints."""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.backends.local.cluster import LocalCluster, NodeState
from infra.nodes.at_once import at_once

# Services each pool role runs once the playbooks have converged.
EXPECTED_SERVICES = {
    "service": ["munge", "slurmctld", "slurmdbd", "prometheus-node-exporter"],
    "train": ["munge", "slurmd", "prometheus-node-exporter"],
    "infer": ["prometheus-node-exporter"],
}
# Model servers run one `gpuplat-inference@N` unit per GPU group; replica 0 exists on every inference node.
SERVING_SERVICES = {"service": ["haproxy", "prometheus"], "infer": ["gpuplat-inference@0"]}
REGISTRY_SERVICE = "gpuplat-registry"  # roles/model_registry, on the gateway's node (serving.registry)


def expected_services(role: str, serving: bool) -> list[str]:
    return EXPECTED_SERVICES.get(role, []) + (SERVING_SERVICES.get(role, []) if serving else [])


@dataclass(frozen=True)
class PartitionLine:
    name: str
    state: str
    nodes: int
    gres: str
    node_states: str


@dataclass(frozen=True)
class ServiceLine:
    node: str
    service: str
    state: str


@dataclass
class PlatformStatus:
    stack: str
    nodes: list[NodeState]
    partitions: list[PartitionLine] = field(default_factory=list)
    services: list[ServiceLine] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def parse_sinfo(text: str) -> list[PartitionLine]:
    """Lines of `sinfo -h -o '%P|%a|%D|%G|%T'`, one per partition and node state."""
    lines = []
    for raw in text.splitlines():
        parts = raw.strip().split("|")
        if len(parts) != 5:
            continue
        name, state, count, gres, node_state = parts
        lines.append(PartitionLine(name.rstrip("*"), state, int(count), gres, node_state))
    return lines


def service_states(cluster: LocalCluster, node: str, services: list[str]) -> list[ServiceLine]:
    """One `systemctl is-active` for all of a node's services: it prints one state per unit named, in
    their order (systemd 252, Debian 12, `src/systemctl/systemctl-is-active.c`: a line for each name; it exits
    0 where any is active, so its status says nothing of the others and is not read). A line it did not print
    (the node went away) reads `unknown`. Globs would be listed after the plain names: none are asked."""
    if not services:
        return []
    answer = cluster.exec_unchecked(node, "systemctl", "is-active", *services).splitlines()
    return [
        ServiceLine(node, service, (answer[i].strip() if i < len(answer) else "") or "unknown")
        for i, service in enumerate(services)
    ]


def collect_status(cluster: LocalCluster) -> PlatformStatus:
    states = cluster.states()
    status = PlatformStatus(cluster.platform.name, states)
    running = {s.node.name for s in states if s.state == "running"}
    if not running:
        status.notes.append("no node is running: `gpuplat up --stack local` starts them")
        return status
    controller = cluster.platform.controller_pool.node_names()[0]
    serving = cluster.platform.spec.serving
    registry_node = (
        cluster.platform.gateway_pool.node_names()[0] if serving and serving.registry is not None else None
    )
    asked = {
        state.node.name: expected_services(state.node.role, cluster.platform.spec.serving is not None)
        + ([REGISTRY_SERVICE] if registry_node == state.node.name else [])
        for state in states
        if state.node.name in running
    }
    # The nodes at once: one `podman exec` per node where it was one per service (14 on the local stack).
    answers = at_once(lambda item, _stop: service_states(cluster, *item), list(asked.items()))
    for lines in answers:
        status.services.extend(lines)
    gateway = cluster.gateway_url()
    if gateway is not None:
        model = cluster.platform.spec.serving.model if cluster.platform.spec.serving else ""
        status.endpoints["inference gateway (OpenAI API)"] = gateway
        status.endpoints["sample request"] = (
            f"curl -s {gateway}/embeddings -H 'Content-Type: application/json' "
            f"""-d '{{"model": "{model}", "input": "hello"}}'"""
        )
    registry = cluster.registry_url()
    if registry is not None:
        status.endpoints["model registry (MLflow; gpuplat models)"] = registry
    status.endpoints["prometheus"] = cluster.prometheus_url()
    if controller in running:
        sinfo = cluster.exec_unchecked(controller, "sinfo", "-h", "-o", "%P|%a|%D|%G|%T")
        status.partitions = parse_sinfo(sinfo)
        if not status.partitions:
            status.notes.append("Slurm is not answering on the controller yet (sinfo printed nothing)")
    return status
