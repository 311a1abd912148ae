"""The platform description: one typed model read from `gpu-platform:platform` of a stack file.

Everything downstream (Pulumi program, policy rules, inventory, local cluster) reads this model after
it has been resolved against the shipped data (see `infra.resolve`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Backend = Literal["aws", "onprem", "local"]
PoolRole = Literal["train", "infer", "service"]
Capacity = Literal["on-demand", "spot", "reserved"]
FabricKind = Literal["efa", "infiniband", "roce", "none"]
Placement = Literal["cluster", "spread", "none"]

Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$", description="lower-case name, dashes allowed")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Taint(_Model):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class Host(_Model):
    name: Name
    address: str = Field(min_length=1, description="IP address or DNS name Ansible connects to")


class Reservation(_Model):
    kind: Literal["capacity-reservation", "capacity-block"]
    id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$", description="EC2 capacity reservation id (cr-...)")


class NodePool(_Model):
    name: Name
    role: PoolRole = Field(
        description="train, infer or service: one per pool, never train and infer together"
    )
    instance_type: str = Field(description="a node type of the catalog (gpuplat catalog lists them)")
    count: int | None = Field(None, ge=0, description="fixed node count; or give min/max")
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=0)
    capacity: Capacity = "on-demand"
    reservation: Reservation | None = None
    interruptible: bool = Field(False, description="its work survives losing a node (checkpoints, requeue)")
    zone: str | None = Field(
        None,
        description=(
            "aws: the availability zone the pool launches in (one of the stack's zones); required with a "
            "reservation or Capacity Block, which exist in one zone. Default: training pools the first "
            "zone, other pools every zone"
        ),
    )
    hosts: list[Host] = Field(default_factory=list, description="on-prem: the existing hosts of this pool")
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)

    @field_validator("role", mode="before")
    @classmethod
    def _one_role(cls, value: Any) -> Any:
        roles = value if isinstance(value, list) else [value]
        if isinstance(value, str) and re.search(r"[,+/ ]", value):
            roles = [r for r in re.split(r"[,+/ ]+", value) if r]
        if {"train", "infer"} <= set(roles):
            raise ValueError(
                "a pool is either train or infer, never both: training and inference must not share "
                "nodes; split it into two pools"
            )
        if len(roles) != 1:
            raise ValueError("give exactly one role: train, infer or service")
        return roles[0]

    @model_validator(mode="after")
    def _sizes(self) -> NodePool:
        if self.count is None and self.max is None and not self.hosts:
            raise ValueError("give either count or min/max (on-prem: the list of hosts)")
        if self.count is not None and (self.min is not None or self.max is not None):
            raise ValueError("give either count or min/max, not both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        if self.capacity == "reserved" and self.reservation is None:
            raise ValueError(
                "capacity 'reserved' needs a reservation (capacity-reservation or capacity-block id)"
            )
        if self.reservation is not None and self.capacity != "reserved":
            raise ValueError("a reservation is only used with capacity 'reserved'")
        if self.hosts and (self.min is not None or self.max is not None):
            raise ValueError("a pool of listed hosts has as many nodes as hosts; drop min/max")
        if self.hosts and self.count is not None and self.count != len(self.hosts):
            raise ValueError(f"count ({self.count}) differs from the number of hosts ({len(self.hosts)})")
        return self

    @property
    def min_nodes(self) -> int:
        if self.hosts:
            return len(self.hosts)
        if self.count is not None:
            return self.count
        return self.min if self.min is not None else 0

    @property
    def max_nodes(self) -> int:
        if self.hosts:
            return len(self.hosts)
        if self.count is not None:
            return self.count
        return self.max if self.max is not None else self.min_nodes


class Fabric(_Model):
    kind: FabricKind = "none"
    placement: Placement = "cluster"
    roce_gid_index: int = Field(3, ge=0, description="RoCE v2 GID index NCCL uses")
    socket_interface: str | None = Field(
        None,
        description=(
            "interface NCCL bootstraps on (NCCL_SOCKET_IFNAME), e.g. bond0; unset: every interface but "
            "loopback and container bridges (interface names differ per machine image)"
        ),
    )
    ib_hca: str | None = Field(
        None,
        description=(
            "NCCL_IB_HCA for InfiniBand/RoCE, e.g. '=mlx5_0,mlx5_3'; unset: NCCL picks every active HCA. "
            "Device names are a per-host fact (inbox rdma-core renames devices): set it only where known"
        ),
    )


class ParallelFilesystem(_Model):
    kind: Literal["fsx-lustre", "lustre", "nfs", "local-volume"]
    capacity_tib: float = Field(gt=0)
    read_gbps_per_gpu: float = Field(
        gt=0, description="target sustained read throughput per training GPU, in GB/s"
    )
    mount_path: str = Field("/shared", pattern=r"^/")
    source: str | None = Field(
        None,
        description=(
            "onprem: what the nodes mount, e.g. '10.0.0.5@o2ib:/lustre' (Lustre MGS NID and file system) "
            "or 'nfs1.example.com:/export/shared' (NFS). aws (FSx) and local get it from the platform"
        ),
    )


_FILESYSTEMS_BY_BACKEND: dict[str, tuple[str, ...]] = {
    "aws": ("fsx-lustre",),
    "onprem": ("lustre", "nfs"),
    "local": ("local-volume",),
}

Purpose = Literal["datasets", "checkpoints", "models"]


class Bucket(_Model):
    purpose: Purpose
    noncurrent_retention_days: int = Field(30, ge=1, le=3650)


class ObjectStore(_Model):
    buckets: list[Bucket] = Field(default_factory=list)

    @field_validator("buckets")
    @classmethod
    def _unique_purpose(cls, buckets: list[Bucket]) -> list[Bucket]:
        purposes = [b.purpose for b in buckets]
        if len(purposes) != len(set(purposes)):
            raise ValueError("each purpose (datasets, checkpoints, models) may appear once")
        return buckets


class Storage(_Model):
    parallel_fs: ParallelFilesystem
    object_store: ObjectStore = Field(default_factory=ObjectStore)
    checkpoint_path: str = Field(pattern=r"^/")


class Team(_Model):
    name: Name
    gpu_quota: int = Field(ge=1, description="most GPUs the team's running jobs may hold (GrpTRES gres/gpu)")
    fairshare: int = Field(1, ge=1, description="fair-share weight (Slurm association Fairshare)")
    users: list[Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]] = Field(default_factory=list)


class Scheduler(_Model):
    kind: Literal["slurm", "kueue"] = Field(
        "slurm",
        description=(
            "slurm: Slurm on the nodes (partitions, QoS, accounting); kueue: Kubernetes with Kueue queues "
            "per team (needs the kubernetes section)"
        ),
    )
    controller_pool: Name | None = Field(None, description="service pool hosting slurmctld; default: first")
    teams: list[Team] = Field(min_length=1)
    spot_preempt_mode: Literal["requeue", "cancel"] = "requeue"
    scale_down_idle_s: int = Field(
        600,
        ge=60,
        description=(
            "aws: seconds a node of an elastic training pool (min < max) stays idle before it is powered "
            "down (Slurm SuspendTime)"
        ),
    )
    high_availability: bool = Field(
        False,
        description=(
            "two controller nodes as a primary/backup slurmctld pair sharing their state on the parallel "
            "filesystem, with one accounting database; needs exactly two nodes in the controller pool"
        ),
    )
    default_time_limit: str = Field("24:00:00", pattern=r"^\d+:\d{2}:\d{2}$")


KubernetesDistribution = Literal["eks", "existing"]


class Kubernetes(_Model):
    distribution: KubernetesDistribution = Field(
        description="eks: the platform creates an EKS cluster (backend aws); existing: a cluster you run "
        "(backend onprem), reached through kubeconfig and context"
    )
    version: str = Field(
        "1.34",
        pattern=r"^1\.\d{2}$",
        description="Kubernetes minor version: the EKS cluster's, or the one the existing cluster runs "
        "(objects are checked against its API)",
    )
    kubeconfig: str | None = Field(
        None, description="existing: kubeconfig file; default: $KUBECONFIG, else ~/.kube/config"
    )
    context: str | None = Field(None, description="existing: kubeconfig context; default: the current one")
    autoscaler: Literal["cluster-autoscaler", "none"] | None = Field(
        None,
        description="who adds and removes nodes of elastic pools; default: cluster-autoscaler on eks, "
        "none on an existing cluster (its nodes are the listed hosts)",
    )
    admin_arns: list[Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:.+")]] = Field(
        default_factory=list,
        description="eks: IAM users or roles that get cluster admin through EKS access entries",
    )
    serving_namespace: Name = Field("serving", description="namespace of the model servers and gateway")

    @property
    def scaler(self) -> str:
        if self.autoscaler is not None:
            return self.autoscaler
        return "cluster-autoscaler" if self.distribution == "eks" else "none"


_DISTRIBUTION_BACKEND: dict[str, str] = {"eks": "aws", "existing": "onprem"}


class Serving(_Model):
    engine: Literal["vllm", "cpu-reference"]
    model: str = Field(min_length=1, description="model name or object-store/mirror path")
    pool: Name = Field(description="the infer pool that serves it")
    gateway_pool: Name | None = Field(None, description="service pool hosting the gateway; default: first")
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(1, ge=1)
    gateway_timeout_s: float = Field(30, gt=0)
    max_queue: int = Field(64, ge=0, description="requests the gateway queues before answering 503")
    queue_timeout_s: float = Field(2, gt=0)
    max_inflight_per_replica: int = Field(8, ge=1)
    gpu_memory_fraction: float = Field(0.9, gt=0, le=1)
    p95_target_ms: int = Field(2000, ge=1)
    engine_version: str | None = Field(
        None,
        pattern=r"^\d+\.\d+\.\d+(\.\d+)?$",
        description="vLLM release; default: the newest one whose torch's CUDA runs on the driver branch",
    )
    model_params_b: float | None = Field(
        None, gt=0, description="model size in billions of parameters; sizes the tensor-parallel degree"
    )
    weight_bytes_per_param: float = Field(
        2, gt=0, le=4, description="2 for bf16/fp16, 1 for fp8, 0.5 for int4"
    )
    kv_cache_gib: float = Field(
        8, ge=0, description="KV cache one replica needs at max_inflight_per_replica sequences (GiB)"
    )
    tensor_parallel: int | None = Field(
        None, ge=1, description="GPUs per replica; default: the smallest power of two the model fits in"
    )

    @model_validator(mode="after")
    def _replicas(self) -> Serving:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is larger than max_replicas ({self.max_replicas})"
            )
        return self


OsRelease = Literal["debian12", "debian13", "ubuntu2204", "ubuntu2404"]


class Software(_Model):
    os_release: OsRelease | None = Field(
        None,
        description=(
            "OS release of the GPU nodes (infra/data/packages.yaml); versions are only picked from what "
            "NVIDIA publishes for it. Default: ubuntu2204 on aws (the default AMI), debian12 elsewhere"
        ),
    )
    driver_branch: int | None = None
    driver_version: str | None = None
    cuda: str | None = Field(None, pattern=r"^\d+\.\d+$")
    nccl: str | None = Field(None, pattern=r"^\d+\.\d+\.\d+$")
    fabric_manager: str | None = None


class AwsSettings(_Model):
    image_id: str | None = Field(
        None,
        pattern=r"^ami-[0-9a-f]{8,17}$",
        description="AMI for every pool; default: the public SSM parameter of the Deep Learning Base GPU AMI",
    )
    image_ssm_parameter: str = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    )
    vpc_cidr: str = Field("10.64.0.0/16", pattern=r"^\d+\.\d+\.\d+\.\d+/\d+$")
    root_volume_gib: int = Field(200, ge=50, le=16384)
    gateway_port: int = Field(8080, ge=1, le=65535)
    model_server_port: int = Field(8000, ge=1, le=65535)


class Tags(_Model):
    owner: str = Field(min_length=1)
    team: str = Field(min_length=1)
    cost_center: str = Field(min_length=1, alias="cost-center")


class Budget(_Model):
    max_gpus: int = Field(ge=0)
    max_hourly_usd: float = Field(ge=0)


class PlatformSpec(_Model):
    name: Name
    backend: Backend
    environment: Literal["production", "staging", "development"] = "development"
    region: str | None = None
    zones: list[str] = Field(default_factory=list)
    fabric: Fabric = Field(default_factory=Fabric)
    pools: list[NodePool] = Field(min_length=1)
    storage: Storage
    scheduler: Scheduler
    kubernetes: Kubernetes | None = None
    serving: Serving | None = None
    software: Software = Field(default_factory=Software)
    aws: AwsSettings = Field(default_factory=AwsSettings)
    tags: Tags
    budget: Budget

    @model_validator(mode="after")
    def _cross_references(self) -> PlatformSpec:
        names = [p.name for p in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique: {', '.join(duplicates)}")
        if self.backend == "aws" and (not self.region or not self.zones):
            raise ValueError("backend aws needs region and zones")
        by_name = {p.name: p for p in self.pools}
        if not any(p.role == "service" for p in self.pools):
            raise ValueError("a platform needs a service pool (Slurm controller, gateway, monitoring)")
        if not any(p.role == "train" for p in self.pools):
            raise ValueError("a platform needs at least one train pool")
        if self.scheduler.controller_pool and by_name.get(self.scheduler.controller_pool) is None:
            raise ValueError(f"scheduler.controller_pool {self.scheduler.controller_pool!r} is not a pool")
        if self.serving is not None:
            target = by_name.get(self.serving.pool)
            if target is None or target.role != "infer":
                raise ValueError(f"serving.pool {self.serving.pool!r} must name an infer pool")
            if self.serving.max_replicas > target.max_nodes:
                raise ValueError(
                    f"serving.max_replicas ({self.serving.max_replicas}) exceeds the nodes of pool "
                    f"{target.name!r} ({target.max_nodes})"
                )
        self._check_kubernetes()
        if self.scheduler.kind == "slurm":
            self._check_controllers(by_name)
        self._check_parallel_fs()
        for pool in self.pools:
            self._check_zone(pool)
            if self.backend == "onprem" and not pool.hosts:
                raise ValueError(f"pool {pool.name!r}: backend onprem lists its hosts (name, address)")
            if self.backend != "onprem" and pool.hosts:
                raise ValueError(f"pool {pool.name!r}: hosts are only given for backend onprem")
            if self.backend == "onprem" and pool.capacity != "on-demand":
                raise ValueError(f"pool {pool.name!r}: on-prem hosts are owned; capacity must be on-demand")
            if self.backend == "local" and pool.capacity == "reserved":
                raise ValueError(f"pool {pool.name!r}: capacity reservations exist only on aws")
        return self

    def _check_kubernetes(self) -> None:
        k8s = self.kubernetes
        if self.scheduler.kind == "kueue" and k8s is None:
            raise ValueError(
                "scheduler.kind kueue runs on Kubernetes: add a kubernetes section (distribution: eks on "
                "backend aws, existing on backend onprem)"
            )
        if k8s is None:
            return
        if self.scheduler.kind != "kueue":
            raise ValueError(
                "kubernetes: the section drives the Kueue platform; set scheduler.kind: kueue, or drop the "
                "section to keep Slurm"
            )
        wanted = _DISTRIBUTION_BACKEND[k8s.distribution]
        if self.backend != wanted:
            allowed = ", ".join(f"{d} on backend {b}" for d, b in _DISTRIBUTION_BACKEND.items())
            raise ValueError(
                f"kubernetes.distribution {k8s.distribution!r} does not run on backend {self.backend} "
                f"(allowed: {allowed}; the local backend runs Slurm only)"
            )
        if k8s.distribution != "existing" and (k8s.kubeconfig or k8s.context):
            raise ValueError(
                "kubernetes.kubeconfig and kubernetes.context reach an existing cluster; an eks cluster's "
                "access comes from the cluster the platform creates"
            )
        if k8s.distribution == "existing" and k8s.autoscaler == "cluster-autoscaler":
            raise ValueError(
                "kubernetes.autoscaler cluster-autoscaler scales EKS node groups; an existing cluster's "
                "nodes are the listed hosts: use none"
            )
        if k8s.distribution != "eks" and k8s.admin_arns:
            raise ValueError("kubernetes.admin_arns are EKS access entries; give them with distribution eks")
        if self.scheduler.high_availability:
            raise ValueError(
                "scheduler.high_availability pairs Slurm controllers; Kubernetes runs its own control plane"
            )

    def _check_controllers(self, by_name: dict[str, NodePool]) -> None:
        wanted = self.scheduler.controller_pool
        pool = by_name[wanted] if wanted else self.pools_with_role("service")[0]
        where = f"pool {pool.name!r} (the Slurm controller pool)"
        if pool.min_nodes != pool.max_nodes:
            raise ValueError(f"{where} runs slurmctld: give it a fixed count (1, or 2 for high availability)")
        nodes = pool.max_nodes
        if self.scheduler.high_availability and nodes != 2:
            raise ValueError(
                f"scheduler.high_availability pairs a primary and a backup slurmctld: {where} needs "
                f"exactly 2 nodes, it has {nodes}"
            )
        if not self.scheduler.high_availability and nodes != 1:
            raise ValueError(
                f"{where} has {nodes} nodes, but only one would be the controller while every node ran "
                "slurmctld and slurmdbd: give it count 1, or count 2 with scheduler.high_availability: "
                "true (primary/backup slurmctld sharing state on the parallel filesystem)"
            )

    def _check_parallel_fs(self) -> None:
        fs = self.storage.parallel_fs
        allowed = _FILESYSTEMS_BY_BACKEND[self.backend]
        if fs.kind not in allowed:
            raise ValueError(
                f"storage.parallel_fs.kind {fs.kind!r} is not provided on backend {self.backend}; "
                f"allowed: {', '.join(allowed)}"
            )
        if self.backend == "onprem" and not fs.source:
            raise ValueError(
                f"storage.parallel_fs.source: backend onprem mounts an existing {fs.kind} file system; "
                "give what the nodes mount, e.g. '10.0.0.5@o2ib:/lustre' or 'nfs1:/export/shared'"
            )
        if self.backend != "onprem" and fs.source:
            raise ValueError(
                f"storage.parallel_fs.source is only given on backend onprem; on {self.backend} the "
                "platform creates the file system and knows its address"
            )

    def _check_zone(self, pool: NodePool) -> None:
        if pool.zone is not None and self.backend != "aws":
            raise ValueError(f"pool {pool.name!r}: zone is only given on backend aws")
        if self.backend != "aws":
            return
        if pool.zone is not None and pool.zone not in self.zones:
            raise ValueError(
                f"pool {pool.name!r}: zone {pool.zone!r} is not one of the stack's zones "
                f"({', '.join(self.zones)})"
            )
        if pool.reservation is not None and pool.zone is None:
            raise ValueError(
                f"pool {pool.name!r}: a {pool.reservation.kind} exists in one availability zone; give the "
                f"pool's zone (one of {', '.join(self.zones)}) so its instances launch where the "
                "reservation is"
            )

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.pools if p.name == name)

    def pools_with_role(self, role: PoolRole) -> list[NodePool]:
        return [p for p in self.pools if p.role == role]
