"""Contradictions between a stack and the shipped data: the node types it names
(infra/data/gpu_catalog.yaml), and the Ansible its nodes can run on themselves (infra/data/node_ansible.yaml).

Each is reported at the stack field that is wrong, with what is allowed there. A pool whose instance type
the catalog lacks is skipped here: resolving the platform reports it with the types the backend offers.
"""

from __future__ import annotations

from infra.data.models import Catalog, NodeType
from infra.data.node_ansible_choice import node_ansible_problem, runnable_releases
from infra.errors.problems import FieldProblem
from infra.spec.defaults import os_release
from infra.spec.models import PlatformSpec


def catalog_problems(spec: PlatformSpec, catalog: Catalog) -> list[FieldProblem]:
    return (
        _gpus_in_service_pools(spec, catalog)
        + _quotas_no_size_can_fill(spec, catalog)
        + _tensor_parallel_beyond_node(spec, catalog)
        + _node_ansible(spec)
        + _alternate_instance_types(spec, catalog)
    )


def _shape(node: NodeType, efa: bool) -> dict[str, object]:
    """What Slurm's one node definition of a pool and its launch template say of a node: GPUs (model,
    count, memory), vCPUs, memory and, with EFA, the EFA cards the template gives an interface each."""
    gpu = node.gpu
    shape: dict[str, object] = {
        "GPU model": gpu.model if gpu else None,
        "GPUs": node.gpu_count,
        "GB per GPU": gpu.memory_gb if gpu else 0,
        "vCPUs": node.vcpus,
        "memory GiB": node.memory_gib,
    }
    if efa:
        shape["EFA cards"] = node.network.nics if node.network.fabric == "efa" else 0
    return shape


def _alternate_instance_types(spec: PlatformSpec, catalog: Catalog) -> list[FieldProblem]:
    """A training pool's alternates (and its zones with EFA) against its instance type: one shape, so
    Slurm's node definition (CPUs, RealMemory, Gres) and the launch template's interfaces hold for
    whichever type EC2 launches."""
    problems: list[FieldProblem] = []
    for index, pool in enumerate(spec.pools):
        node = catalog.get(pool.instance_type)
        if node is None or spec.backend != "aws" or pool.role != "train":
            continue
        efa = spec.fabric.kind == "efa" and node.network.fabric == "efa"
        if efa and len(set(pool.zones)) > 1:
            problems.append(
                (
                    ("pools", index, "zones"),
                    f"{node.name} uses EFA (fabric efa), which does not reach across zones: give the pool "
                    "one zone, or another fabric",
                )
            )
        expected = _shape(node, efa)
        for position, name in enumerate(pool.alternate_instance_types):
            where = ("pools", index, "alternate_instance_types", position)
            other = catalog.get(name)
            if other is None or other.provider != "aws":
                same = [n.name for n in catalog.node_types if n.provider == "aws" and n.gpu == node.gpu]
                others = ", ".join(n for n in same if n != node.name) or "none"
                problems.append(
                    (where, f"{name} is no aws type of the catalog; of {node.name}'s GPUs: {others}")
                )
                continue
            if pool.capacity == "spot" and other.price.spot_discount is None:
                problems.append((where, f"{name} is not offered as spot, and the pool's capacity is spot"))
            found = _shape(other, efa)
            differ = [
                f"{key} {found[key]} (not {value})" for key, value in expected.items() if found[key] != value
            ]
            if differ:
                problems.append(
                    (
                        where,
                        f"{name} differs from the pool's instance_type {node.name}: {'; '.join(differ)}. "
                        "Slurm has one node definition per pool and the launch template one set of network "
                        "interfaces, so an alternate must match them; give it a pool of its own",
                    )
                )
    return problems


def nodes_configure_themselves(spec: PlatformSpec) -> bool:
    """Nodes that run the playbooks on themselves at boot: Slurm stacks on aws
    (infra/backends/aws/bootstrap.py). Elsewhere the nodes are Ansible's targets (the operator's machine
    is the controller), and EKS nodes are configured by Kubernetes."""
    return spec.backend == "aws" and spec.scheduler.kind == "slurm"


def _node_ansible(spec: PlatformSpec) -> list[FieldProblem]:
    """The nodes' OS release must ship a Python some Ansible release runs on as a controller, and that
    Ansible must have what the roles use."""
    if not nodes_configure_themselves(spec):
        return []
    release = os_release(spec)
    problem = node_ansible_problem(release)
    if problem is None:
        return []
    given = "" if spec.software.os_release else f" (not set: the {spec.backend} default, {release})"
    others = [r for r in runnable_releases() if r != release]
    return [
        (
            ("software", "os_release"),
            f"{release}{given}: the nodes configure themselves at boot, running Ansible on their own "
            f"python3, and {problem}. Set software.os_release to a release whose nodes can run the roles: "
            f"{', '.join(others) or 'none in the facts'}",
        )
    ]


def _gpus_in_service_pools(spec: PlatformSpec, catalog: Catalog) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    for index, pool in enumerate(spec.pools):
        node = catalog.get(pool.instance_type)
        if pool.role != "service" or node is None or node.gpu_count == 0:
            continue
        cpu_types = [n.name for n in catalog.node_types if n.provider == node.provider and n.gpu_count == 0]
        problems.append(
            (
                ("pools", index, "instance_type"),
                f"{node.name} has {node.gpu_count} GPUs, but a service pool runs no GPU work (controller, "
                f"gateway, monitoring): give it a CPU type ({', '.join(cpu_types)}), or give the pool the "
                "role train or infer",
            )
        )
    return problems


def _quotas_no_size_can_fill(spec: PlatformSpec, catalog: Catalog) -> list[FieldProblem]:
    """A team quota above the training GPUs at full size and above the GPU budget: no size of the stack
    within its budget lets the team reach it. (Above the training GPUs alone, the pools may yet grow to
    it; above the budget alone, the budget-gpus policy judges the pools.)"""
    sized = [(p, catalog.get(p.instance_type)) for p in spec.pools_with_role("train")]
    per_pool = [(p.name, p.max_nodes * node.gpu_count) for p, node in sized if node is not None]
    if len(per_pool) < len(sized):
        return []  # an unknown instance type: resolving the platform names it
    training_gpus = sum(gpus for _, gpus in per_pool)
    budget = spec.budget.max_gpus
    pools = ", ".join(f"{name} {gpus}" for name, gpus in per_pool)
    return [
        (
            ("scheduler", "teams", index, "gpu_quota"),
            f"{team.gpu_quota} GPUs is more than the {training_gpus} training GPUs the stack has at full "
            f"size ({pools}) and more than its budget of {budget} GPUs (budget.max_gpus), so the team could "
            f"never reach it: at most {max(training_gpus, budget)}",
        )
        for index, team in enumerate(spec.scheduler.teams)
        if team.gpu_quota > max(training_gpus, budget)
    ]


def _tensor_parallel_beyond_node(spec: PlatformSpec, catalog: Catalog) -> list[FieldProblem]:
    """Tensor parallelism stays inside one node, whatever the engine does across nodes."""
    serving = spec.serving
    if serving is None or serving.tensor_parallel is None:
        return []
    pool = next((p for p in spec.pools if p.name == serving.pool), None)
    node: NodeType | None = catalog.get(pool.instance_type) if pool else None
    if node is None or serving.tensor_parallel <= node.gpu_count:
        return []
    noun = "GPU" if node.gpu_count == 1 else "GPUs"
    return [
        (
            ("serving", "tensor_parallel"),
            f"{serving.tensor_parallel} is more than the {node.gpu_count} {noun} of a {node.name} node (pool "
            f"{serving.pool!r}); tensor parallelism stays inside one node: at most {node.gpu_count}",
        )
    ]
