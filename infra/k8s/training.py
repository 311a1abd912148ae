"""What a training job on the Kueue platform gets from the platform: the NCCL settings the Slurm nodes
get in /etc/nccl.conf (rendered from the nccl role's own template), the checkpoint directory on the
shared filesystem, and an example JobSet that uses both (docs/kubernetes.md, `gpuplat manifests`)."""

from __future__ import annotations

from infra.k8s.objects import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    LABEL_CAPACITY,
    Manifest,
    capacity_label,
    k8s_object,
    team_namespace,
)
from infra.k8s.queues import (
    LOCAL_QUEUE,
    PREFERRED_TOPOLOGY_ANNOTATION,
    flavor_limits,
    narrowest_network_level,
    queue_uses_topology,
)
from infra.nodes.inventory import platform_vars, pool_vars
from infra.nodes.role_templates import render_role_template
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.scheduling.placement import training_order
from infra.scheduling.slurm import SPOT_GRACE_TIME_S

TRAINING_CONFIG = "gpuplat-training"
SHARED_CLAIM = "shared"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
EXAMPLE_IMAGE = "nvcr.io/nvidia/pytorch:25.09-py3"
# Where docs/training.md has users copy examples/train_dist/ on the shared filesystem.
EXAMPLE_PROGRAM = "jobs/train_dist/train.py"
# JobSet labels every pod with its restart attempt (kubernetes-sigs/jobset, pkg/constants RestartsKey).
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
# What the grace leaves the SIGTERM save: torchrun SIGKILLs its workers --shutdown-timeout seconds after
# forwarding SIGTERM, 30 unless told (torch/distributed/launcher/api.py:145-149 @v2.13.0), and the pod
# gets SPOT_GRACE_TIME_S; the rest is for torchrun to end. As examples/train_dist/train.sbatch does.
TORCHRUN_SHUTDOWN_MARGIN_S = 10
# A pod's own network interface: the container runtimes name the pod's interface eth0 (CNI_IFNAME that
# containerd's and CRI-O's CRI plugins pass to the CNI plugin), whatever the node's interfaces are
# called, so fabric.socket_interface (a host interface such as bond0) does not apply inside a pod.
POD_INTERFACE = "eth0"


def nccl_environment(
    platform: ResolvedPlatform, pool: ResolvedPool, overrides: dict[str, str] | None = None
) -> dict[str, str]:
    """The KEY=VALUE settings of the node's nccl.conf for `pool`, as environment variables; `overrides`
    are nccl role variables that differ where the job runs (a pod's interface)."""
    values = {**platform_vars(platform), **pool_vars(platform, pool), **(overrides or {})}
    text = render_role_template("nccl", "nccl.conf.j2", values)
    settings: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def training_environment(platform: ResolvedPlatform) -> dict[str, str]:
    """One environment for every training pool of the stack (they share the fabric settings; the
    nccl role renders per pool, and the pools of one stack give the same lines: checked in tests)."""
    pool = platform.pools_with_role("train")[0]
    return {
        **nccl_environment(platform, pool, {"nccl_socket_ifname": POD_INTERFACE}),
        "GPUPLAT_SHARED_PATH": platform.spec.storage.parallel_fs.mount_path,
        "GPUPLAT_CHECKPOINT_DIR": platform.spec.storage.checkpoint_path,
        "GPUPLAT_CHECKPOINT_EVERY": str(platform.spec.training.checkpoint_every_steps),
    }


def training_config(platform: ResolvedPlatform, team: str) -> Manifest:
    return k8s_object(
        "v1", "ConfigMap", TRAINING_CONFIG, team_namespace(team), data=training_environment(platform)
    )


def example_size(platform: ResolvedPlatform, team: str, nodes: int = 2) -> tuple[ResolvedPool, int, int]:
    """The example's pool (the first on-demand pool the team may hold GPUs on; a spot one where its
    whole cap is spot), its pods and GPUs per pod: up to `nodes` whole nodes, as many as the team may
    hold there (its cap, its on-demand part), at least one pod of at most a node's GPUs."""
    member = next(t for t in platform.spec.scheduler.teams if t.name == team)
    limits = flavor_limits(platform, member)
    reachable = [p for p in training_order(platform, member.placement) if limits[p.name] > 0]
    pool = next(
        (p for p in reachable if p.spec.capacity != "spot"),
        reachable[0] if reachable else platform.pools_with_role("train")[0],
    )
    reach = min(limits[pool.name], member.gpu_quota)
    per_pod = min(pool.gpus_per_node, reach)
    return pool, max(1, min(nodes, reach // max(per_pod, 1))), per_pod


def example_jobset(platform: ResolvedPlatform, team: str, nodes: int = 2) -> Manifest:
    """A PyTorch job for `team`, multi-node where its reach allows (example_size): one pod per node,
    the EFA devices on EFA pools, the training environment, the shared filesystem (checkpoints), queued
    by Kueue."""
    pool, nodes, gpus = example_size(platform, team, nodes)
    limits: dict[str, int] = {GPU_RESOURCE: gpus}
    if platform.uses_efa(pool):
        limits[EFA_RESOURCE] = pool.node_type.network.nics
    name = "llm-pretrain"
    mount = platform.spec.storage.parallel_fs.mount_path
    # The Slurm example's program (examples/train_dist/train.py, copied to the shared filesystem), with
    # what the Slurm TaskProlog sets: OpenMP threads from the pod's CPUs per GPU worker, and NCCL's setup
    # logged on the job's first attempt only (beside its checkpoints, for `gpuplat nccl-report`).
    checkpoints = "$(GPUPLAT_CHECKPOINT_DIR)/$(JOBSET_NAME)"
    command = (
        f"threads=$$(( POD_CPUS / {gpus} > 0 ? POD_CPUS / {gpus} : 1 )); "
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}; "
        'if [ "$JOBSET_RESTART_ATTEMPT" = 0 ]; then export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV '
        f"NCCL_DEBUG_FILE={checkpoints}/nccl-%h-%p.log; fi; "
        f"mkdir -p {checkpoints} && exec torchrun --nnodes={nodes} --nproc-per-node={gpus} "
        f"--node-rank=$(JOB_COMPLETION_INDEX) --rdzv-backend=c10d "
        f"--rdzv-endpoint={name}-workers-0-0.{name}:29500 "
        f"--shutdown-timeout={SPOT_GRACE_TIME_S - TORCHRUN_SHUTDOWN_MARGIN_S} "
        f"{mount}/{EXAMPLE_PROGRAM} --dir {checkpoints}"
    )
    annotations = {"prometheus.io/scrape": "false"}
    if queue_uses_topology(platform, team):
        # As close on the network as the pool allows, wider only when the job does not fit.
        annotations[PREFERRED_TOPOLOGY_ANNOTATION] = narrowest_network_level()
    pod = {
        "metadata": {"annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            # A drained (spot) node's pods get SIGTERM and this long to save, as Slurm's spot QoS gives.
            "terminationGracePeriodSeconds": SPOT_GRACE_TIME_S,
            # Jobs that must not run on spot pin on-demand capacity (a team whose cap is all spot, spot);
            # Kueue only offers matching flavors.
            "nodeSelector": {LABEL_CAPACITY: capacity_label(pool)},
            "containers": [
                {
                    "name": "trainer",
                    "image": EXAMPLE_IMAGE,
                    "command": ["/bin/bash", "-c", command],
                    "env": [
                        {
                            "name": "JOBSET_NAME",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}
                            },
                        },
                        {
                            "name": "JOBSET_RESTART_ATTEMPT",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": f"metadata.labels['{RESTART_ATTEMPT_LABEL}']"}
                            },
                        },
                        {
                            # Without a CPU limit, the node's allocatable CPUs (the downward API's rule).
                            "name": "POD_CPUS",
                            "valueFrom": {
                                "resourceFieldRef": {"containerName": "trainer", "resource": "limits.cpu"}
                            },
                        },
                    ],
                    "envFrom": [{"configMapRef": {"name": TRAINING_CONFIG}}],
                    "ports": [{"containerPort": 29500, "name": "rendezvous"}],
                    "resources": {"limits": limits, "requests": limits},
                    "volumeMounts": [
                        {"name": SHARED_CLAIM, "mountPath": mount},
                        {"name": "dshm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                {"name": SHARED_CLAIM, "persistentVolumeClaim": {"claimName": SHARED_CLAIM}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }
    return k8s_object(
        JOBSET_API,
        "JobSet",
        name,
        team_namespace(team),
        labels={"kueue.x-k8s.io/queue-name": LOCAL_QUEUE, "kueue.x-k8s.io/priority-class": "normal"},
        spec={
            # A lost node or a preempted pod restarts the whole job from its last checkpoint.
            "failurePolicy": {"maxRestarts": 5},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": nodes,
                            "completions": nodes,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": pod,
                        }
                    },
                }
            ],
        },
    )
