"""The platform description: one typed model read from `gpu-platform:platform` of a stack file.

Everything downstream (Pulumi program, policy rules, inventory, local cluster) reads this model after
it has been resolved against the shipped data (see `infra.platform.resolve`).
"""

from __future__ import annotations

import ipaddress
import re
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from infra.errors.problems import FieldProblem, FieldProblems
from infra.spec.cross_checks import platform_problems, repeats
from infra.spec.limits import MAX_NODES, MAX_NODES_REASON
from infra.spec.user_ids import EXPLICIT_UID_MAX, EXPLICIT_UID_MIN, uid_problems

Backend = Literal["aws", "onprem", "local"]
PoolRole = Literal["train", "infer", "service"]
Capacity = Literal["on-demand", "spot", "reserved"]
FabricKind = Literal["efa", "infiniband", "roce", "none"]
Placement = Literal["cluster", "spread", "none"]

NAME_PATTERN = r"^[a-z][a-z0-9-]{0,30}$"
USER_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"
# A registered model the platform serves: its name names servers, systemd units and Kubernetes objects.
REGISTERED_MODEL_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
RESERVATION_PATTERN = r"^cr-[0-9a-f]{8,17}$"
ABSOLUTE_PATH_PATTERN = r"^/"
TIME_LIMIT_PATTERN = r"^\d+:\d{2}:\d{2}$"
KUBERNETES_VERSION_PATTERN = r"^1\.\d{2}$"
ROLE_ARN_PATTERN = r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:.+"
ENGINE_VERSION_PATTERN = r"^\d+\.\d+\.\d+(\.\d+)?$"
CUDA_PATTERN = r"^\d+\.\d+$"
NCCL_PATTERN = r"^\d+\.\d+\.\d+$"
AMI_PATTERN = r"^ami-[0-9a-f]{8,17}$"

# What a value matching each pattern looks like, for messages (a bare regex helps nobody).
PATTERN_MEANINGS: dict[str, str] = {
    NAME_PATTERN: "a lower-case name: a letter, then at most 30 letters, digits or dashes (e.g. train-spot)",
    USER_PATTERN: "a Linux user name: a lower-case letter or _, then at most 31 lower-case letters, digits, "
    "_ or - (e.g. alice)",
    RESERVATION_PATTERN: "an EC2 capacity reservation id: cr- and 8 to 17 hex digits "
    "(e.g. cr-0123456789abcdef0)",
    ABSOLUTE_PATH_PATTERN: "an absolute path, starting with / (e.g. /shared)",
    TIME_LIMIT_PATTERN: "a time limit HOURS:MM:SS (e.g. 24:00:00)",
    KUBERNETES_VERSION_PATTERN: 'a Kubernetes minor version 1.NN, in quotes (e.g. "1.34")',
    ROLE_ARN_PATTERN: "an IAM user or role ARN (e.g. arn:aws:iam::123456789012:role/admin)",
    ENGINE_VERSION_PATTERN: "a release number MAJOR.MINOR.PATCH (e.g. 0.11.0)",
    CUDA_PATTERN: "a CUDA version MAJOR.MINOR (e.g. 12.8)",
    NCCL_PATTERN: "an NCCL version MAJOR.MINOR.PATCH (e.g. 2.27.7)",
    AMI_PATTERN: "an AMI id: ami- and 8 to 17 hex digits (e.g. ami-0123456789abcdef0)",
}

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case name, dashes allowed")]


def _at_most(limit: int, unit: str, reason: str) -> AfterValidator:
    def check(value: int) -> int:
        if value > limit:
            raise ValueError(f"at most {limit} {unit}, {reason}")
        return value

    return AfterValidator(check)


NodeCount = Annotated[int, Field(ge=0), _at_most(MAX_NODES, "nodes", MAX_NODES_REASON)]

# AWS tag values: at most 256 characters; letters, digits, spaces and + - = . _ : / @; no aws: prefix
# (https://docs.aws.amazon.com/batch/latest/userguide/tag-restrictions.html, "Tag restrictions").
_TAG_VALUE_MAX = 256
_TAG_PUNCTUATION = "+-=._:/@"


def _tag_value(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or blank: cost reports and owners are found through the tags")
    if len(value) > _TAG_VALUE_MAX:
        raise ValueError(f"at most {_TAG_VALUE_MAX} characters (an AWS tag value), got {len(value)}")
    if value.lower().startswith("aws:"):
        raise ValueError("must not start with aws: (AWS reserves that prefix)")
    odd = sorted({c for c in value if not (c.isalnum() or c == " " or c in _TAG_PUNCTUATION)})
    if odd:
        raise ValueError(
            f"may hold letters, digits, spaces and {' '.join(_TAG_PUNCTUATION)} (AWS tag rules), "
            f"not {''.join(odd)!r}"
        )
    return value


TagValue = Annotated[str, AfterValidator(_tag_value)]


def _ipv4_network(value: str) -> str:
    try:
        ipaddress.IPv4Network(value)
    except ValueError as exc:
        raise ValueError(f"must be an IPv4 network such as 10.64.0.0/16 ({exc})") from None
    return value


def _number_kinds(annotation: Any) -> set[type]:
    """int and float among what a field's annotation allows (through Optional and Annotated)."""
    if annotation in (int, float):
        return {annotation}
    if get_origin(annotation) is Annotated:
        return _number_kinds(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        kinds: set[type] = set()
        for member in get_args(annotation):
            kinds |= _number_kinds(member)
        return kinds if str not in get_args(annotation) else set()
    return set()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_text(cls, value: Any, info: ValidationInfo) -> Any:
        """A number given in quotes ("80") is refused, not read as 80: a quoted value is text in YAML, and
        a setting that only reads as a number by luck is a typo waiting (pydantic would convert it)."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, str) and field is not None and _number_kinds(field.annotation):
            raise ValueError("must be a number, not text: write it without quotes")
        return value


class Taint(_Model):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class Host(_Model):
    name: Name
    address: str = Field(min_length=1, description="IP address or DNS name Ansible connects to")


class Reservation(_Model):
    kind: Literal["capacity-reservation", "capacity-block"]
    id: str = Field(pattern=RESERVATION_PATTERN, description="EC2 capacity reservation id (cr-...)")


class NodePool(_Model):
    name: Name
    role: PoolRole = Field(
        description="train, infer or service: one per pool, never train and infer together"
    )
    instance_type: str = Field(description="a node type of the catalog (gpuplat catalog lists them)")
    count: NodeCount | None = Field(None, description="fixed node count; or give min/max")
    min: NodeCount | None = None
    max: NodeCount | None = None
    capacity: Capacity = "on-demand"
    reservation: Reservation | None = None
    interruptible: bool = Field(False, description="its work survives losing a node (checkpoints, requeue)")
    dataset_cache_path: str | None = Field(
        None,
        pattern=ABSOLUTE_PATH_PATTERN,
        description="train pools: a directory on the nodes' local NVMe where the stack's datasets are cached",
    )
    zone: str | None = Field(
        None,
        description=(
            "aws: the availability zone the pool launches in (one of the stack's zones); required with a "
            "reservation or Capacity Block, which exist in one zone. Default: training pools the first "
            "zone, other pools every zone"
        ),
    )
    alternate_instance_types: list[str] = Field(
        default_factory=list,
        description=(
            "aws training pools: further instance types Slurm may launch the pool's nodes on when "
            "instance_type has no capacity (an instant EC2 Fleet over them). Each must have the same GPU "
            "model, count and memory, vCPUs and memory as instance_type (Slurm's node definition is "
            "one for the pool) and, on an efa fabric, as many EFA cards (the launch template's interfaces)"
        ),
    )
    zones: list[str] = Field(
        default_factory=list,
        description=(
            "aws training pools: the zones (of the stack's) Slurm may launch the pool's nodes in, each "
            "job's nodes in one of them; instead of zone. Not with a reservation, EFA or a cluster "
            "placement group, none of which spans zones"
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
        if not all(isinstance(r, str) for r in roles):
            return value  # not a role at all: the field's own check names what is allowed
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
        problems: list[FieldProblem] = []
        if self.count is None and self.max is None and not self.hosts:
            problems.append((("count",), "give either count or min/max (on-prem: the list of hosts)"))
        if self.count is not None and (self.min is not None or self.max is not None):
            problems.append((("count",), "give either count or min/max, not both"))
        if self.min is not None and self.max is not None and self.min > self.max:
            problems.append((("min",), f"min ({self.min}) is larger than max ({self.max})"))
        if self.capacity == "reserved" and self.reservation is None:
            problems.append(
                (
                    ("reservation",),
                    "capacity 'reserved' needs a reservation (capacity-reservation or capacity-block id)",
                )
            )
        if self.reservation is not None and self.capacity != "reserved":
            problems.append((("capacity",), "a reservation is only used with capacity 'reserved'"))
        if self.hosts and (self.min is not None or self.max is not None):
            problems.append(
                (
                    ("min" if self.min is not None else "max",),
                    "a pool of listed hosts has as many nodes as hosts; drop min/max",
                )
            )
        if self.hosts and self.count is not None and self.count != len(self.hosts):
            problems.append(
                (("count",), f"count ({self.count}) differs from the number of hosts ({len(self.hosts)})")
            )
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def size_field(self) -> str:
        """The key that sets the pool's size in the stack: hosts, count or max."""
        if self.hosts:
            return "hosts"
        return "count" if self.count is not None else "max"

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
    mount_path: str = Field("/shared", pattern=ABSOLUTE_PATH_PATTERN)
    source: str | None = Field(
        None,
        description=(
            "onprem: what the nodes mount, e.g. '10.0.0.5@o2ib:/lustre' (Lustre MGS NID and file system) "
            "or 'nfs1.example.com:/export/shared' (NFS). aws (FSx) and local get it from the platform"
        ),
    )


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
    checkpoint_path: str = Field(pattern=ABSOLUTE_PATH_PATTERN)


PlacementPreference = Literal["performance", "cost"] | list[Name]


class JobClass(_Model):
    name: Name = Field(
        description="slurm: the partition (dashes become underscores) a job picks the class with (`-p NAME`)"
    )
    placement: PlacementPreference = Field(
        description="the order the class's jobs try the on-demand training pools in, whatever their team's"
    )


class Team(_Model):
    name: Name
    gpu_quota: int = Field(ge=1, description="most GPUs the team's running jobs may hold (GrpTRES gres/gpu)")
    fairshare: int = Field(1, ge=1, description="fair-share weight (Slurm association Fairshare)")
    users: list[Annotated[str, Field(pattern=USER_PATTERN)]] = Field(default_factory=list)
    iam_principals: list[Annotated[str, Field(pattern=ROLE_ARN_PATTERN)]] = Field(
        default_factory=list,
        description=(
            "kubernetes eks: IAM users or roles of the team's members; each gets an EKS access entry in the "
            "team's Kubernetes group (gpuplat:<team>), which the team namespace's RoleBinding names"
        ),
    )
    placement: PlacementPreference | None = Field(
        None,
        description=(
            "which training pools the team's jobs try first: performance (the fastest GPUs: dense BF16, then "
            "memory bandwidth, from the catalog), cost (the cheapest GPU-hour) or a list of training pool "
            "names (those first, in that order), the next when those are full; on-demand before spot "
            "either way; unset: the stack's pool order"
        ),
    )
    spot_gpu_quota: int | None = Field(
        None,
        ge=0,
        description=(
            "kueue: GPUs of gpu_quota the team may hold on spot pools, the rest on the others (Kueue caps "
            "each flavor on its own, so the cap is split across them); default: what the on-demand pools "
            "leave of gpu_quota"
        ),
    )

    @model_validator(mode="after")
    def _spot_within_cap(self) -> Team:
        if self.spot_gpu_quota is not None and self.spot_gpu_quota > self.gpu_quota:
            raise ValueError(
                f"team {self.name}: spot_gpu_quota {self.spot_gpu_quota} is above its gpu_quota "
                f"{self.gpu_quota}"
            )
        return self


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
    job_classes: list[JobClass] = Field(
        default_factory=list,
        description=(
            "slurm: placement preferences a job picks by partition instead of its team's (e.g. a `fastest` "
            "class for a deadline run of a cost-first team); each is a partition over the on-demand "
            "training pools"
        ),
    )
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
    default_time_limit: str = Field("24:00:00", pattern=TIME_LIMIT_PATTERN)
    resume_timeout_s: int = Field(
        1800,
        ge=60,
        le=86400,
        description=(
            "Slurm ResumeTimeout: seconds a launched node has to register before it is terminated and its "
            "job requeued; the plan refuses one shorter than the pools' expected boot "
            "(infra/data/boot_times.yaml)"
        ),
    )

    user_ids: dict[
        Annotated[str, Field(pattern=USER_PATTERN)],
        Annotated[int, Field(ge=EXPLICIT_UID_MIN, le=EXPLICIT_UID_MAX)],
    ] = Field(
        default_factory=dict,
        description=(
            "uid of a team user (and gid of their own group) on the nodes where the platform creates the "
            "users (the local backend), for users whose numbers come from a directory; any other user's is "
            "20000 + md5(name) mod 10000, from their name alone (adding or removing a user changes no other "
            "user's); two users of one uid are refused"
        ),
    )

    @model_validator(mode="after")
    def _unique_teams(self) -> Scheduler:
        problems: list[FieldProblem] = [
            (("teams", index, "name"), f"team {name!r} is already teams[{first}]; each team is listed once")
            for index, first, name in repeats([t.name for t in self.teams])
        ]
        problems += uid_problems(self)
        problems += [
            (("job_classes", index, "name"), f"job class {name!r} is already job_classes[{first}]")
            for index, first, name in repeats([c.name for c in self.job_classes])
        ]
        if self.job_classes and self.kind != "slurm":
            problems.append(
                (
                    ("job_classes",),
                    "job classes are Slurm partitions; on kueue a job picks a pool with a nodeSelector on "
                    "its flavor's node labels",
                )
            )
        if problems:
            raise FieldProblems(problems)
        return self


KubernetesDistribution = Literal["eks", "existing"]


class Kubernetes(_Model):
    distribution: KubernetesDistribution = Field(
        description="eks: the platform creates an EKS cluster (backend aws); existing: a cluster you run "
        "(backend onprem), reached through kubeconfig and context"
    )
    version: str = Field(
        "1.34",
        pattern=KUBERNETES_VERSION_PATTERN,
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
    admin_arns: list[Annotated[str, Field(pattern=ROLE_ARN_PATTERN)]] = Field(
        default_factory=list,
        description="eks: IAM users or roles that get cluster admin through EKS access entries",
    )
    serving_namespace: Name = Field("serving", description="namespace of the model servers and gateway")

    @property
    def scaler(self) -> str:
        if self.autoscaler is not None:
            return self.autoscaler
        return "cluster-autoscaler" if self.distribution == "eks" else "none"


class Registry(_Model):
    """The model registry: an MLflow tracking and Model Registry server on the gateway's node (its
    database and artifacts on the shared filesystem)."""

    port: int = Field(5000, ge=1, le=65535, description="the registry's HTTP port on its node")
    shared_models: dict[Annotated[str, Field(pattern=REGISTERED_MODEL_PATTERN)], list[Name]] = Field(
        default_factory=dict,
        description=(
            "registered model -> the teams whose users may add its versions and move its aliases (MLflow's "
            "EDIT), e.g. {embedder: [research, product]}; the platform creates it. Any other registered "
            "model or experiment belongs to the user who created it; everyone else may only read it"
        ),
    )


MIN_ERROR_RATE_INCREASE = 0.01
"""The least serving.canary.max_error_rate_increase (see its validator's message for why)."""


UNDONE = {"failure_limit": "failed", "inconclusive_limit": "unjudged"}


MAX_CANARY_STEPS = 10


class CanaryStep(_Model):
    """One step of a stepped release: the canary's share, held for one analysis (Argo Rollouts' canary
    step `setWeight` with `pause`, pkg/apis/rollouts/v1alpha1/types.go:658-664 at v1.10.0-rc1-70-g9f8d111;
    Flagger's `stepWeights`, pkg/apis/flagger/v1beta1/canary.go:282-284 at v1.44.0)."""

    percent: int = Field(
        ge=1,
        le=100,
        description="the canary's share of the requests at this step (percent); 100 is the promotion",
    )
    manual_gate: bool = Field(
        False,
        description=(
            "after this step's analysis passes, wait for an operator (`gpuplat serve guard NAME "
            "--past-gate`) before the next step (Argo Rollouts' `pause: {}` without a duration)"
        ),
    )


class Canary(_Model):
    """How `gpuplat serve --canary` admits a version and when its guard rolls the canary back."""

    gate_metric: str | None = Field(
        None,
        min_length=1,
        description=(
            "evaluation metric a version must carry (a tag of that name on the registry's version, e.g. "
            "written by the training job) to enter a canary; unset: no gate"
        ),
    )
    gate_min: float | None = Field(
        None, description="least value of gate_metric a version needs (besides at least the stable's)"
    )
    higher_is_better: bool = Field(True, description="false for metrics such as loss or perplexity")
    max_error_rate_increase: float = Field(
        0.05,
        le=1,
        description=(
            "canary error rate allowed above the stable version's (0.05: 5 points), at least "
            "MIN_ERROR_RATE_INCREASE: the error tests' null hypothesis is a canary rate at most the stable's "
            "(its upper confidence bound) plus this"
        ),
    )
    max_latency_ratio: float = Field(
        1.2,
        ge=1,
        description=(
            "canary mean latency allowed, as a multiple of the stable version's (from the histogram's _sum "
            "and _count); a significantly slower rank (Mann-Whitney) fails an interval only beyond it. The "
            "latency is the time to the first token (for vLLM; the whole answer for the CPU reference "
            "server, whose first token is the whole answer), and for vLLM the inter-token latency too"
        ),
    )
    max_slow_share_increase: float = Field(
        0.1,
        ge=0,
        le=1,
        description=(
            "share of the canary's answers slower than the stable version's median latency bucket allowed "
            "above the stable's share (half, or less on coarse buckets): the sequential latency test's margin"
        ),
    )
    initial_delay_s: int = Field(
        0,
        ge=0,
        le=3600,
        description=(
            "seconds after the canary gets its share before the analysis starts (Argo Rollouts' "
            "initialDelay): a version slow while it warms up (caches, compilation) is not judged on that; "
            "nothing is judged in them, a failing canary included"
        ),
    )
    interval_s: int = Field(
        60, ge=10, le=3600, description="length of one analysis interval (seconds); intervals do not overlap"
    )
    intervals: int = Field(
        5, ge=1, le=100, description="intervals the analysis lasts before the canary is promote-ready"
    )
    failure_limit: int = Field(
        1,
        ge=0,
        description=(
            "failed intervals of one metric allowed; one more rolls the canary back (Argo's failureLimit)"
        ),
    )
    inconclusive_limit: int = Field(
        1,
        ge=0,
        description=(
            "intervals of one metric with too few canary requests allowed; one more ends the analysis "
            "inconclusive (Argo's inconclusiveLimit)"
        ),
    )
    alpha: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="significance level of each interval's test (per metric and interval)",
    )
    sequential_alpha: float = Field(
        0.002,
        gt=0,
        lt=0.5,
        description=(
            "bound on the sequential test's false rollbacks (per metric, however often it looks): it rolls "
            "back as soon as the evidence since the canary started reaches 1/sequential_alpha"
        ),
    )
    min_requests: int = Field(
        50,
        ge=1,
        description=(
            "requests the canary must have answered since it started before it is promote-ready; an "
            "interval with fewer than min_requests / intervals canary requests is inconclusive"
        ),
    )
    share_percent: int = Field(
        20,
        ge=1,
        le=99,
        description=(
            "the canary's share of the requests the analysis is sized for (percent; below 100: at 100 the "
            "stable version answers nothing to compare with)"
        ),
    )
    steps: list[CanaryStep] = Field(
        default_factory=list,
        max_length=MAX_CANARY_STEPS,
        description=(
            "a stepped release: the canary's share rises through these steps, each held for one analysis "
            "(e.g. 5, 20, 50, 100); percents rise strictly, and 100, the promotion, can only be the last. "
            "Empty: one analysis at share_percent"
        ),
    )
    expected_requests_per_s: float | None = Field(
        None,
        gt=0,
        description=(
            "requests per second the gateway serves; with it a setting the canary's share cannot meet is "
            "refused (here for share_percent, at `serve deploy` for --canary)"
        ),
    )
    gpus: Literal["borrow", "spare"] = Field(
        "borrow",
        description=(
            "where a vLLM canary on GPU nodes runs (Slurm stacks): borrow, on the GPUs of one stable replica "
            "of one node, drained and stopped while the canary runs (capacity one replica less during a "
            "release; the pool needs at least 2 replicas at its smallest); spare, on a GPU group each node "
            "keeps free for it (one replica per node less, always; a node needs at least 2 GPU groups)"
        ),
    )

    @property
    def analysis_s(self) -> int:
        return self.interval_s * self.intervals

    @property
    def interval_min_requests(self) -> int:
        """Canary requests an interval needs to be judged."""
        return -(-self.min_requests // self.intervals)

    def traffic_problem(self, percent: int) -> str | None:
        """Why a canary at `percent` of expected_requests_per_s cannot be judged in the analysis (None: it
        can, or no rate is given)."""
        rate = self.expected_requests_per_s
        if rate is None:
            return None
        least = -(-self.interval_min_requests * 100 // (rate * self.interval_s))
        needs = (
            f"fewer than the {self.interval_min_requests} each interval needs (min_requests "
            f"{self.min_requests} / intervals {self.intervals}): every interval would be inconclusive"
        )
        per_interval = rate * percent / 100 * self.interval_s
        if per_interval < self.interval_min_requests:
            cure = (
                f"give the canary at least {least:.0f} %"
                if least <= 100
                else "no share can: lower min_requests or raise interval_s"
            )
            return (
                f"a canary at {percent} % of {rate:g} requests/s answers about {per_interval:.1f} requests "
                f"per {self.interval_s} s interval, {needs}; {cure}"
            )
        # The analysis compares the canary with the stable version: it needs as many answers of both.
        stable_per_interval = rate * (100 - percent) / 100 * self.interval_s
        if percent < 100 and stable_per_interval < self.interval_min_requests:
            return (
                f"a canary at {percent} % of {rate:g} requests/s leaves the stable version about "
                f"{stable_per_interval:.1f} requests per {self.interval_s} s interval to compare with, "
                f"{needs}; "
                + (
                    f"give the canary at most {100 - least:.0f} %"
                    if 2 * least <= 100
                    else "no share leaves both versions enough: lower min_requests or raise interval_s"
                )
            )
        return None

    @model_validator(mode="after")
    def _gate(self) -> Canary:
        if self.gate_min is not None and self.gate_metric is None:
            raise FieldProblems([(("gate_min",), "gate_min needs gate_metric: the metric it bounds")])
        problems: list[FieldProblem] = []
        if self.max_error_rate_increase < MIN_ERROR_RATE_INCREASE:
            problems.append(
                (
                    ("max_error_rate_increase",),
                    f"max_error_rate_increase {self.max_error_rate_increase:g} is below "
                    f"{MIN_ERROR_RATE_INCREASE:g}: the gateway's 5xx counts include answers no version "
                    "caused (its own 503s when its queue is full land on the canary by the same draw), and "
                    "an interval judged on min_requests / intervals requests cannot tell "
                    f"{MIN_ERROR_RATE_INCREASE:.0%} from less; set it to at least that",
                )
            )
        for name in UNDONE:
            if getattr(self, name) >= self.intervals:
                problems.append(
                    (
                        (name,),
                        f"{name} {getattr(self, name)} is not below intervals {self.intervals}: the "
                        f"analysis could end promote-ready with every interval {UNDONE[name]}; set it to "
                        f"at most {self.intervals - 1}",
                    )
                )
        problems += self._step_problems()
        if problems:
            raise FieldProblems(problems)
        problem = self.traffic_problem(self.share_percent)
        if problem is not None:
            raise FieldProblems([(("min_requests",), problem)])
        return self

    def _step_problems(self) -> list[FieldProblem]:
        """Steps whose shares do not rise, a promotion before the last step, and shares the traffic cannot
        judge (with expected_requests_per_s)."""
        problems: list[FieldProblem] = []
        for index, step in enumerate(self.steps):
            where = ("steps", index, "percent")
            earlier = self.steps[index - 1].percent if index else 0
            if step.percent <= earlier:
                problems.append(
                    (
                        where,
                        f"step {index + 1} gives the canary {step.percent} %, not more than step {index}'s "
                        f"{earlier} %: each step's share must be larger than the one before (e.g. 5, 20, "
                        "50, 100)",
                    )
                )
            elif step.percent == 100 and index < len(self.steps) - 1:
                problems.append(
                    (
                        where,
                        f"step {index + 1} gives the canary 100 % (the promotion) but "
                        f"{len(self.steps) - index - 1} step(s) follow it: 100 can only be the last step",
                    )
                )
            elif step.percent < 100:
                problem = self.traffic_problem(step.percent)
                if problem is not None:
                    problems.append((where, f"step {index + 1}: {problem}"))
        return problems


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
    ttft_p95_target_ms: int = Field(
        2000,
        ge=1,
        description=(
            "p95 time to first token the platform holds (alert, and scaling on Kubernetes): the wait a user "
            "sees before the answer starts, whatever its length"
        ),
    )
    itl_p95_target_ms: int = Field(
        100, ge=1, description="p95 time between two tokens of an answer (inter-token latency, alerted on)"
    )
    engine_version: str | None = Field(
        None,
        pattern=ENGINE_VERSION_PATTERN,
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
    max_model_len: int = Field(
        8192,
        ge=16,
        description=(
            "longest sequence, prompt and answer, a replica serves (tokens); vLLM's --max-model-len. vLLM "
            "starts only if the KV cache of one such sequence fits in the memory left after the weights "
            "(vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory); unset, it would take the "
            "model's whole context (131,072 tokens for Llama 3.1)"
        ),
    )
    kv_cache_bytes_per_token: int | None = Field(
        None,
        gt=0,
        description=(
            "KV cache of one token, every layer: 2 (K and V) x layers x KV heads x head dim x bytes per "
            "element, from the model's config.json (Llama 3.1 8B in bf16: 2 x 32 x 8 x 128 x 2 = 131072); "
            "with it the plan checks vLLM's floor of one max_model_len sequence"
        ),
    )
    tensor_parallel: int | None = Field(
        None, ge=1, description="GPUs per replica; default: the smallest power of two the model fits in"
    )
    registry: Registry | None = Field(
        None, description="run the model registry (MLflow) that `gpuplat models` and `gpuplat serve` use"
    )
    canary: Canary = Field(default_factory=Canary)

    @model_validator(mode="after")
    def _replicas(self) -> Serving:
        problems: list[FieldProblem] = []
        if self.min_replicas > self.max_replicas:
            problems.append(
                (
                    ("min_replicas",),
                    f"min_replicas ({self.min_replicas}) is larger than max_replicas ({self.max_replicas})",
                )
            )
        if self.engine == "cpu-reference" and self.tensor_parallel is not None:
            problems.append(
                (
                    ("tensor_parallel",),
                    "the cpu-reference engine runs on the CPU, on no GPU: give tensor_parallel with "
                    "engine vllm",
                )
            )
        if problems:
            raise FieldProblems(problems)
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
    cuda: str | None = Field(None, pattern=CUDA_PATTERN)
    nccl: str | None = Field(None, pattern=NCCL_PATTERN)
    fabric_manager: str | None = None
    efa_installer: str | None = Field(
        None,
        pattern=r"^\d+\.\d+\.\d+$",
        description=(
            "fabric efa: the AWS EFA installer release (infra/data/packages.yaml); its aws-ofi-nccl plugin "
            "must support the nodes' NCCL and the training environment's. Default: the newest that does"
        ),
    )


class AwsSettings(_Model):
    image_id: str | None = Field(
        None,
        pattern=AMI_PATTERN,
        description="AMI for every pool; default: the public SSM parameter of the Deep Learning Base GPU AMI",
    )
    image_ssm_parameter: str | None = Field(
        None,
        description=(
            "SSM parameter holding the AMI; default: the plain image of software.os_release (Canonical's, "
            "Debian's public parameter), on which the roles install the whole pinned GPU stack. Images with "
            "a preinstalled GPU stack (the Deep Learning AMIs) are refused by the roles, naming what they "
            "carry"
        ),
    )
    bake_images: bool = Field(
        True,
        description=(
            "build a node image per GPU pool with EC2 Image Builder (the bundle's GPU roles on the plain "
            "image, then sealed), so launched nodes only configure and join; false: every node installs at "
            "boot"
        ),
    )
    vpc_cidr: Annotated[str, AfterValidator(_ipv4_network)] = "10.64.0.0/16"
    root_volume_gib: int = Field(200, ge=50, le=16384)
    gateway_port: int = Field(8080, ge=1, le=65535)
    model_server_port: int = Field(8000, ge=1, le=65535)


# AWS tag keys: at most 128 characters, the value's characters, no aws: prefix (same source as above).
_TAG_KEY_MAX = 128
# Keys the platform sets on every resource itself.
PLATFORM_TAG_KEYS = ("environment", "Name")
PLATFORM_TAG_PREFIX = "gpuplat:"


def _tag_key_problem(key: str) -> str | None:
    if len(key) > _TAG_KEY_MAX:
        return f"at most {_TAG_KEY_MAX} characters (an AWS tag key), got {len(key)}"
    if key in PLATFORM_TAG_KEYS or key.startswith(PLATFORM_TAG_PREFIX):
        return f"the platform sets {key!r} itself ({', '.join(PLATFORM_TAG_KEYS)}, {PLATFORM_TAG_PREFIX}*)"
    try:
        _tag_value(key)
    except ValueError as exc:
        return str(exc)
    return None


class Tags(_Model):
    """owner, team and cost-center, and any further tags the organisation requires (a project, a
    data classification): every taggable cloud resource carries them all."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    owner: TagValue
    team: TagValue
    cost_center: TagValue = Field(alias="cost-center")

    @model_validator(mode="after")
    def _further_tags(self) -> Tags:
        problems = []
        for key, value in (self.model_extra or {}).items():
            key_problem = _tag_key_problem(key)
            if key_problem:
                problems.append(f"tag key {key!r}: {key_problem}")
            elif not isinstance(value, str):
                problems.append(f"tag {key!r}: the value must be a string, got {type(value).__name__}")
            else:
                try:
                    _tag_value(value)
                except ValueError as exc:
                    problems.append(f"tag {key!r}: {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def as_dict(self) -> dict[str, str]:
        """Every tag, by its key on the resources."""
        return {
            "owner": self.owner,
            "team": self.team,
            "cost-center": self.cost_center,
            **(self.model_extra or {}),
        }


class Budget(_Model):
    max_gpus: int = Field(ge=0)
    max_hourly_usd: float = Field(ge=0)


class Alerting(_Model):
    webhook_urls: list[str] = Field(
        default_factory=list,
        description=(
            "where the monitoring node's Alertmanager sends every alert (its webhook format); empty: alerts "
            "stay in the Alertmanager's UI"
        ),
    )

    @field_validator("webhook_urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not re.fullmatch(r"https?://[^\s\"]+", url):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return urls


class Dataset(_Model):
    name: Name
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="cached per version on nodes")
    source: str = Field(
        pattern=r"^(s3://datasets/\S+|/\S*)$",
        description=(
            "s3://datasets/<path> (the datasets bucket; aws: the FSx data repository association shows it "
            "under <shared path>/datasets/<path>, elsewhere the operator copies it there) or an absolute "
            "path on the shared filesystem"
        ),
    )


class Training(_Model):
    torch_version: str | None = Field(
        "2.13.0",
        pattern=r"^\d+\.\d+\.\d+$",
        description=(
            "the torch release installed once into <shared path>/envs/torch-<version> for training jobs "
            "(infra/data/compatibility.yaml must list it, and its CUDA build must run on the driver); "
            "null: no shared environment"
        ),
    )
    wheelhouse: str | None = Field(
        None,
        pattern=ABSOLUTE_PATH_PATTERN,
        description="a directory of wheels on the controller to install from, offline (air-gapped clusters)",
    )
    checkpoint_every_steps: int = Field(
        50, ge=1, description="the checkpoint interval jobs get as GPUPLAT_CHECKPOINT_EVERY (steps)"
    )
    shm_percent: int = Field(
        50,
        ge=1,
        le=90,
        description="size of /dev/shm on training nodes in percent of memory (DataLoader workers use it)",
    )


class PlatformSpec(_Model):
    name: Name
    backend: Backend
    environment: Literal["production", "staging", "development"] = "development"
    region: str | None = Field(None, description="aws: the region, e.g. us-east-1")
    zones: list[str] = Field(default_factory=list, description="aws: availability zones of the region")
    fabric: Fabric = Field(default_factory=Fabric)
    pools: list[NodePool] = Field(min_length=1)
    storage: Storage
    scheduler: Scheduler
    kubernetes: Kubernetes | None = None
    serving: Serving | None = None
    alerting: Alerting = Field(default_factory=Alerting)
    training: Training = Field(default_factory=Training)
    datasets: list[Dataset] = Field(default_factory=list)
    software: Software = Field(default_factory=Software)
    aws: AwsSettings = Field(default_factory=AwsSettings)
    tags: Tags
    budget: Budget

    @model_validator(mode="after")
    def _cross_references(self) -> PlatformSpec:
        """Contradictions between fields, each reported at the field that is wrong, all at once."""
        problems = platform_problems(self)
        if problems:
            raise FieldProblems(problems)
        return self

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.pools if p.name == name)

    def pools_with_role(self, role: PoolRole) -> list[NodePool]:
        return [p for p in self.pools if p.role == role]
