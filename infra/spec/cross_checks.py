"""Contradictions between the fields of a platform description, each reported at the field that is wrong
with what is allowed there (FieldProblems: locations relative to the platform mapping)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.errors.problems import FieldProblem, Loc
from infra.spec.aws_regions import AWS_REGIONS, is_zone_of
from infra.spec.limits import MAX_NODES, MAX_NODES_REASON
from infra.spec.names import PLACEMENT_PARTITION

if TYPE_CHECKING:
    from infra.spec.models import NodePool, PlatformSpec, PoolRole

_FILESYSTEMS_BY_BACKEND: dict[str, tuple[str, ...]] = {
    "aws": ("fsx-lustre",),
    "onprem": ("lustre", "nfs"),
    "local": ("local-volume",),
}

_DISTRIBUTION_BACKEND: dict[str, str] = {"eks": "aws", "existing": "onprem"}


def repeats(values: list[str]) -> list[tuple[int, int, str]]:
    """(index, index of its first occurrence, value) for every value seen before."""
    first: dict[str, int] = {}
    found = []
    for index, value in enumerate(values):
        if value in first:
            found.append((index, first[value], value))
        first.setdefault(value, index)
    return found


def _listing(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def platform_problems(spec: PlatformSpec) -> list[FieldProblem]:
    checks = (
        _check_pool_names,
        _check_region,
        _check_roles,
        _check_scheduler_pools,
        _check_job_class_names,
        _check_serving,
        _check_kubernetes,
        _check_parallel_fs,
        _check_pools_on_backend,
        _check_hosts,
        _check_total_nodes,
        _check_controllers,
        _check_datasets,
    )
    return [problem for check in checks for problem in check(spec)]


def _check_pool_names(spec: PlatformSpec) -> list[FieldProblem]:
    return [
        (("pools", index, "name"), f"pool name {name!r} is already pools[{first}]; pool names are unique")
        for index, first, name in repeats([p.name for p in spec.pools])
    ]


def _check_region(spec: PlatformSpec) -> list[FieldProblem]:
    if spec.backend != "aws":
        return [
            ((key,), f"{key} is only given on backend aws (this stack's backend is {spec.backend})")
            for key in ("region", "zones")
            if getattr(spec, key)
        ]
    problems: list[FieldProblem] = []
    if not spec.region:
        problems.append((("region",), "backend aws needs region and zones: give the region, e.g. us-east-1"))
    elif spec.region not in AWS_REGIONS:
        problems.append(
            (
                ("region",),
                f"{spec.region!r} is not an AWS region; regions: {', '.join(sorted(AWS_REGIONS))}",
            )
        )
    if not spec.zones:
        problems.append((("zones",), "backend aws needs region and zones: give the availability zones"))
    for index, first, zone in repeats(spec.zones):
        problems.append((("zones", index), f"zone {zone!r} is already zones[{first}]"))
    if spec.region in AWS_REGIONS:
        region = spec.region
        problems += [
            (
                ("zones", index),
                f"{zone!r} is not a zone of region {region}: its zones are named {region} and a letter "
                f"(e.g. {region}a), Local Zones {region}-LOCATION (e.g. {region}-bos-1a)",
            )
            for index, zone in enumerate(spec.zones)
            if not is_zone_of(zone, region)
        ]
    return problems


def _check_roles(spec: PlatformSpec) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    for role, needed_for in (
        ("service", "Slurm controller or Kubernetes system pods, gateway, monitoring"),
        ("train", "training jobs"),
    ):
        pools = [(i, p) for i, p in enumerate(spec.pools) if p.role == role]
        if not pools:
            noun = "a service pool" if role == "service" else "at least one train pool"
            problems.append((("pools",), f"a platform needs {noun} ({needed_for})"))
        elif all(p.max_nodes == 0 for _, p in pools):
            problems += [
                (
                    ("pools", i, p.size_field),
                    f"the stack's {role} pools have no nodes at full size, so nothing runs its "
                    f"{needed_for}: give this pool at least 1 node",
                )
                for i, p in pools
            ]
    return problems


def _pool_names(spec: PlatformSpec, role: PoolRole) -> str:
    return _listing([p.name for p in spec.pools_with_role(role)])


def _check_scheduler_pools(spec: PlatformSpec) -> list[FieldProblem]:
    wanted = spec.scheduler.controller_pool
    if wanted is None or _has_pool(spec, wanted, "service"):
        return []
    return [
        (
            ("scheduler", "controller_pool"),
            f"{wanted!r} is not a service pool of this stack; service pools: {_pool_names(spec, 'service')}",
        )
    ]


def _check_job_class_names(spec: PlatformSpec) -> list[FieldProblem]:
    """A job class is a Slurm partition: its name is no training pool's partition, nor the shared one."""
    taken = {
        p.name.replace("-", "_"): f"the partition of training pool {p.name!r}"
        for p in spec.pools_with_role("train")
    }
    taken[PLACEMENT_PARTITION] = "the partition over the on-demand training pools"
    return [
        (
            ("scheduler", "job_classes", index, "name"),
            f"job class {job_class.name!r} would be the Slurm partition {partition!r}, which is already "
            f"{taken[partition]}; name the class otherwise",
        )
        for index, job_class in enumerate(spec.scheduler.job_classes)
        if (partition := job_class.name.replace("-", "_")) in taken
    ]


def _has_pool(spec: PlatformSpec, name: str, role: PoolRole) -> bool:
    return any(p.name == name and p.role == role for p in spec.pools)


def _check_serving(spec: PlatformSpec) -> list[FieldProblem]:
    serving = spec.serving
    if serving is None:
        return []
    problems: list[FieldProblem] = []
    if not _has_pool(spec, serving.pool, "infer"):
        problems.append(
            (
                ("serving", "pool"),
                f"serving.pool {serving.pool!r} must name an infer pool of this stack; infer pools: "
                f"{_pool_names(spec, 'infer')}",
            )
        )
    elif serving.max_replicas > spec.pool(serving.pool).max_nodes:
        target = spec.pool(serving.pool)
        problems.append(
            (
                ("serving", "max_replicas"),
                f"serving.max_replicas ({serving.max_replicas}) exceeds the nodes of pool "
                f"{target.name!r} ({target.max_nodes})",
            )
        )
    if serving.gateway_pool is not None and not _has_pool(spec, serving.gateway_pool, "service"):
        problems.append(
            (
                ("serving", "gateway_pool"),
                f"{serving.gateway_pool!r} is not a service pool of this stack; service pools: "
                f"{_pool_names(spec, 'service')}",
            )
        )
    if serving.registry is not None and spec.scheduler.kind == "kueue":
        problems.append(
            (
                ("serving", "registry"),
                "the model registry runs as a service on the gateway's node of Slurm stacks; on Kubernetes "
                "(scheduler.kind kueue) the platform does not deploy it yet: remove serving.registry and run "
                "MLflow as your own Deployment",
            )
        )
    if serving.registry is not None:
        teams = [team.name for team in spec.scheduler.teams]
        for model, sharing in serving.registry.shared_models.items():
            unknown = [team for team in sharing if team not in teams]
            if unknown:
                problems.append(
                    (
                        ("serving", "registry", "shared_models", model),
                        f"{_listing(unknown)} {'is not a team' if len(unknown) == 1 else 'are not teams'} "
                        f"of this stack; teams: {_listing(teams)}",
                    )
                )
    return problems


def _kueue_needs_kubernetes(spec: PlatformSpec) -> list[FieldProblem]:
    if spec.scheduler.kind != "kueue":
        return []
    return [
        (
            ("kubernetes",),
            "scheduler.kind kueue runs on Kubernetes: add a kubernetes section (distribution: eks on "
            "backend aws, existing on backend onprem)",
        )
    ]


def _check_team_principals(spec: PlatformSpec) -> list[FieldProblem]:
    """Team members' IAM principals become EKS access entries: EKS only, and one entry per principal."""
    k8s = spec.kubernetes
    teams = [(i, team) for i, team in enumerate(spec.scheduler.teams) if team.iam_principals]
    if k8s is None or k8s.distribution != "eks":
        return [
            (
                ("scheduler", "teams", index, "iam_principals"),
                "teams[].iam_principals are EKS access entries; give them with kubernetes.distribution eks",
            )
            for index, _ in teams
        ]
    owner = {arn: "kubernetes.admin_arns" for arn in k8s.admin_arns}
    problems: list[FieldProblem] = []
    for index, team in teams:
        for position, arn in enumerate(team.iam_principals):
            if arn in owner:
                problems.append(
                    (
                        ("scheduler", "teams", index, "iam_principals", position),
                        f"{arn} is already in {owner[arn]}: EKS gives a principal one access entry, so it "
                        "can be in one team or the admins, not both",
                    )
                )
            owner.setdefault(arn, f"scheduler.teams[{index}] ({team.name})")
    return problems


def _check_kubernetes(spec: PlatformSpec) -> list[FieldProblem]:
    k8s = spec.kubernetes
    problems: list[FieldProblem] = _check_team_principals(spec)
    if k8s is None:
        return problems + _kueue_needs_kubernetes(spec)
    if spec.scheduler.kind != "kueue":
        return [
            *problems,
            (
                ("scheduler", "kind"),
                "the kubernetes section drives the Kueue platform; set scheduler.kind: kueue, or drop "
                "the kubernetes section to keep Slurm",
            ),
        ]
    wanted = _DISTRIBUTION_BACKEND[k8s.distribution]
    if spec.backend != wanted:
        allowed = ", ".join(f"{d} on backend {b}" for d, b in _DISTRIBUTION_BACKEND.items())
        problems.append(
            (
                ("kubernetes", "distribution"),
                f"kubernetes.distribution {k8s.distribution!r} does not run on backend {spec.backend} "
                f"(allowed: {allowed}; the local backend runs Slurm only)",
            )
        )
    if k8s.distribution != "existing":
        problems += [
            (
                ("kubernetes", key),
                "kubernetes.kubeconfig and kubernetes.context reach an existing cluster; an eks "
                "cluster's access comes from the cluster the platform creates",
            )
            for key in ("kubeconfig", "context")
            if getattr(k8s, key)
        ]
    if k8s.distribution == "existing" and k8s.autoscaler == "cluster-autoscaler":
        problems.append(
            (
                ("kubernetes", "autoscaler"),
                "kubernetes.autoscaler cluster-autoscaler scales EKS node groups; an existing cluster's "
                "nodes are the listed hosts: use none",
            )
        )
    if k8s.distribution != "eks" and k8s.admin_arns:
        problems.append(
            (
                ("kubernetes", "admin_arns"),
                "kubernetes.admin_arns are EKS access entries; give them with distribution eks",
            )
        )
    if spec.scheduler.high_availability:
        problems.append(
            (
                ("scheduler", "high_availability"),
                "scheduler.high_availability pairs Slurm controllers; Kubernetes runs its own control plane",
            )
        )
    return problems


def _check_controllers(spec: PlatformSpec) -> list[FieldProblem]:
    """Slurm: the controller pool runs one slurmctld, or a primary/backup pair."""
    wanted = spec.scheduler.controller_pool
    candidates = [p for p in spec.pools_with_role("service") if wanted in (None, p.name)]
    if spec.scheduler.kind != "slurm" or not candidates:
        return []  # kueue has no Slurm controller; a missing controller pool is reported above
    pool = candidates[0]
    loc: Loc = ("pools", spec.pools.index(pool), pool.size_field)
    where = f"pool {pool.name!r} (the Slurm controller pool)"
    if pool.min_nodes != pool.max_nodes:
        return [(loc, f"{where} runs slurmctld: give it a fixed count (1, or 2 for high availability)")]
    nodes = pool.max_nodes
    if spec.scheduler.high_availability and nodes != 2:
        return [
            (
                loc,
                f"scheduler.high_availability pairs a primary and a backup slurmctld: {where} needs "
                f"exactly 2 nodes, it has {nodes}",
            )
        ]
    if not spec.scheduler.high_availability and nodes != 1:
        return [
            (
                loc,
                f"{where} has {nodes} nodes, but only one would be the controller while every node ran "
                "slurmctld and slurmdbd: give it count 1, or count 2 with scheduler.high_availability: "
                "true (primary/backup slurmctld sharing state on the parallel filesystem)",
            )
        ]
    return []


def _check_parallel_fs(spec: PlatformSpec) -> list[FieldProblem]:
    fs = spec.storage.parallel_fs
    allowed = _FILESYSTEMS_BY_BACKEND[spec.backend]
    problems: list[FieldProblem] = []
    if fs.kind not in allowed:
        problems.append(
            (
                ("storage", "parallel_fs", "kind"),
                f"storage.parallel_fs.kind {fs.kind!r} is not provided on backend {spec.backend}; "
                f"allowed: {', '.join(allowed)}",
            )
        )
    if spec.backend == "onprem" and not fs.source:
        problems.append(
            (
                ("storage", "parallel_fs", "source"),
                f"storage.parallel_fs.source: backend onprem mounts an existing {fs.kind} file system; "
                "give what the nodes mount, e.g. '10.0.0.5@o2ib:/lustre' or 'nfs1:/export/shared'",
            )
        )
    if spec.backend != "onprem" and fs.source:
        problems.append(
            (
                ("storage", "parallel_fs", "source"),
                f"storage.parallel_fs.source is only given on backend onprem; on {spec.backend} the "
                "platform creates the file system and knows its address",
            )
        )
    return problems


def _check_pools_on_backend(spec: PlatformSpec) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    for index, pool in enumerate(spec.pools):
        problems += [(("pools", index, key), message) for key, message in _pool_on_backend(spec, pool)]
    return problems


def _pool_on_backend(spec: PlatformSpec, pool: NodePool) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if pool.zone is not None and spec.backend != "aws":
        problems.append(("zone", "zone is only given on backend aws"))
    if spec.backend == "aws" and pool.zone is not None and pool.zone not in spec.zones:
        problems.append(
            ("zone", f"zone {pool.zone!r} is not one of the stack's zones ({', '.join(spec.zones)})")
        )
    if spec.backend == "aws" and pool.reservation is not None and pool.zone is None:
        problems.append(
            (
                "zone",
                f"a {pool.reservation.kind} exists in one availability zone; give the pool's zone (one "
                f"of {', '.join(spec.zones)}) so its instances launch where the reservation is",
            )
        )
    problems += _launch_choices(spec, pool)
    if spec.backend == "onprem" and not pool.hosts:
        problems.append(("hosts", "backend onprem lists the pool's hosts (name, address)"))
    if spec.backend != "onprem" and pool.hosts:
        problems.append(("hosts", f"hosts are only given for backend onprem, not {spec.backend}"))
    if spec.backend == "onprem" and pool.capacity != "on-demand":
        problems.append(("capacity", "on-prem hosts are owned; capacity must be on-demand"))
    if spec.backend == "local" and pool.capacity == "reserved":
        problems.append(("capacity", "capacity reservations exist only on aws"))
    return problems


def _launch_choices(spec: PlatformSpec, pool: NodePool) -> list[tuple[str, str]]:
    """alternate_instance_types and zones: what Slurm's resume program may launch a training pool's nodes
    on (an instant EC2 Fleet, roles/slurm_elastic/files/gpuplat_ec2_nodes/ec2.py). Neither with a
    reservation (it holds one type in one zone); several zones neither with a cluster placement group
    nor EFA, which work within one zone (as ParallelCluster 3.11 refuses them: aws/aws-parallelcluster
    v3.11.0, cli/src/pcluster/validators/networking_validators.py:141 MultiAzPlacementGroupValidator,
    cluster_validators.py:443 EfaMultiAzValidator; EFA with several zones: catalog_checks.py)."""
    problems: list[tuple[str, str]] = []
    given = [key for key in ("alternate_instance_types", "zones") if getattr(pool, key)]
    for key in given:
        if spec.backend != "aws" or pool.role != "train":
            problems.append((key, f"{key} is only given for training pools on backend aws"))
        elif pool.reservation is not None:
            problems.append(
                (
                    key,
                    f"a {pool.reservation.kind} holds one instance type in one zone: drop {key} or the "
                    "reservation",
                )
            )
    for _index, first, name in repeats(pool.alternate_instance_types):
        problems.append(
            ("alternate_instance_types", f"{name!r} is already alternate_instance_types[{first}]")
        )
    if pool.instance_type in pool.alternate_instance_types:
        problems.append(
            ("alternate_instance_types", f"{pool.instance_type} is the pool's instance_type already")
        )
    if not pool.zones or spec.backend != "aws":
        return problems
    if pool.zone is not None:
        problems.append(("zones", "give zone (one) or zones (several), not both"))
    for _index, first, zone in repeats(pool.zones):
        problems.append(("zones", f"zone {zone!r} is already zones[{first}]"))
    unknown = [zone for zone in pool.zones if zone not in spec.zones]
    if unknown:
        problems.append(
            ("zones", f"{', '.join(unknown)}: not among the stack's zones ({', '.join(spec.zones)})")
        )
    if len(set(pool.zones)) > 1 and spec.fabric.placement == "cluster":
        problems.append(
            (
                "zones",
                "a cluster placement group (fabric.placement, default cluster) lies in one zone: give one "
                "zone, or set fabric.placement to spread or none",
            )
        )
    return problems


def _check_hosts(spec: PlatformSpec) -> list[FieldProblem]:
    """Each host once: listed twice, its GPUs would count twice and two pools would claim it."""
    listed = [
        ((pool_index, host_index), host)
        for pool_index, pool in enumerate(spec.pools)
        for host_index, host in enumerate(pool.hosts)
    ]
    problems: list[FieldProblem] = []
    for key in ("name", "address"):
        values = [getattr(host, key).lower() for _, host in listed]
        for index, first, value in repeats(values):
            (pool_index, host_index), _ = listed[index]
            (first_pool, first_host), _ = listed[first]
            problems.append(
                (
                    ("pools", pool_index, "hosts", host_index, key),
                    f"host {key} {value!r} is already pools[{first_pool}].hosts[{first_host}]; each host "
                    "is listed once, in one pool",
                )
            )
    return problems


def _check_total_nodes(spec: PlatformSpec) -> list[FieldProblem]:
    total = sum(p.max_nodes for p in spec.pools)
    if total <= MAX_NODES:
        return []
    return [
        (
            ("pools",),
            f"the pools add up to {total} nodes at full size; a platform has at most {MAX_NODES}, "
            f"{MAX_NODES_REASON}",
        )
    ]


def _check_datasets(spec: PlatformSpec) -> list[FieldProblem]:
    problems: list[FieldProblem] = [
        (("datasets", index, "name"), f"dataset {name!r} is already datasets[{first}]; names are unique")
        for index, first, name in repeats([d.name for d in spec.datasets])
    ]
    problems += [
        (
            ("pools", index, "dataset_cache_path"),
            f"pool {pool.name} has role {pool.role}: only train pools cache datasets",
        )
        for index, pool in enumerate(spec.pools)
        if pool.dataset_cache_path and pool.role != "train"
    ]
    has_bucket = any(b.purpose == "datasets" for b in spec.storage.object_store.buckets)
    if spec.backend == "aws" and not has_bucket:
        problems += [
            (
                ("datasets", index, "source"),
                f"{item.source} is read through the datasets bucket, and storage.object_store.buckets has "
                "none with purpose datasets: add one (FSx for Lustre then shows it under <mount>/datasets)",
            )
            for index, item in enumerate(spec.datasets)
            if item.source.startswith("s3://")
        ]
    return problems
