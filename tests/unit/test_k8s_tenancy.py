"""Per-team namespaces, access, GPU cap, network isolation, training environment and shared storage."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.k8s.facts import host_path_facts
from infra.k8s.objects import LABEL_POOL, Manifest
from infra.k8s.shared_dirs import team_directory_objects
from infra.k8s.tenancy import team_objects
from infra.k8s.training import EXAMPLE_PROGRAM, RESTART_ATTEMPT_LABEL, example_jobset, training_environment
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.scheduling.slurm import SPOT_GRACE_TIME_S
from infra.spec.load import stack_file
from tests.conftest import fsx_facts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def aws_k8s() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


def of_kind(objects: list[Manifest], kind: str, namespace: str) -> Manifest:
    return next(o for o in objects if o["kind"] == kind and o["metadata"].get("namespace") == namespace)


def test_each_team_gets_its_namespace_with_users_and_gpu_cap(aws_k8s: ResolvedPlatform) -> None:
    objects = team_objects(aws_k8s, fsx_facts())
    namespaces = {o["metadata"]["name"]: o["metadata"]["labels"] for o in objects if o["kind"] == "Namespace"}
    assert namespaces == {
        f"team-{t}": {
            "gpuplat/team": t,
            # Issue 51, item 7: no privileged or hostPath pods of a member on the shared GPU nodes.
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/warn": "baseline",
        }
        for t in ("research", "product", "eval")
    }
    binding = of_kind(objects, "RoleBinding", "team-research")
    users = {s["name"] for s in binding["subjects"] if s["kind"] == "User"}
    assert users == {"alice", "carol"}
    quota = of_kind(objects, "ResourceQuota", "team-product")
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "24"}


def test_network_policy_denies_other_namespaces_but_allows_the_team_and_monitoring(
    aws_k8s: ResolvedPlatform,
) -> None:
    policy = of_kind(team_objects(aws_k8s, fsx_facts()), "NetworkPolicy", "team-eval")["spec"]
    assert policy["podSelector"] == {} and policy["policyTypes"] == ["Ingress"]
    peers = policy["ingress"][0]["from"]
    assert {"podSelector": {}} in peers
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in peers
    assert len(peers) == 2


def test_each_team_mounts_only_its_own_directory_of_the_shared_filesystem(
    aws_k8s: ResolvedPlatform,
) -> None:
    """Issue 51, item 7: every team and the serving namespace mounted the filesystem's root read-write.
    Now a team's volume is its directory teams/<team> (a Lustre subdirectory mount through the FSx CSI
    driver's mount name), one volume per team bound to its claim."""
    objects = team_objects(aws_k8s, fsx_facts())
    volumes = [o for o in objects if o["kind"] == "PersistentVolume"]
    assert len(volumes) == 3 and len({v["metadata"]["name"] for v in volumes}) == 3
    research = next(v for v in volumes if v["spec"]["claimRef"]["namespace"] == "team-research")
    assert research["spec"]["csi"] == {
        "driver": "fsx.csi.aws.com",
        "volumeHandle": "fs-0123456789abcdef0-teams-research",
        "readOnly": False,
        "volumeAttributes": {"dnsname": "fs-0123.fsx.example", "mountname": "abcdef/teams/research"},
    }
    mounted = {v["spec"]["csi"]["volumeAttributes"]["mountname"] for v in volumes}
    assert mounted == {f"abcdef/teams/{t}" for t in ("research", "product", "eval")}
    claim = of_kind(objects, "PersistentVolumeClaim", "team-research")
    assert claim["spec"]["volumeName"] == research["metadata"]["name"]
    assert claim["spec"]["storageClassName"] == research["spec"]["storageClassName"] == ""


def test_existing_clusters_use_the_filesystem_the_hosts_mount() -> None:
    onprem = load_platform(stack_file("onprem"))
    volume = next(o for o in team_objects(onprem, host_path_facts(onprem)) if o["kind"] == "PersistentVolume")
    assert volume["spec"]["hostPath"] == {"path": "/lustre/teams/research", "type": "Directory"}


def test_a_job_creates_every_team_directory_from_the_filesystem_root(aws_k8s: ResolvedPlatform) -> None:
    objects = team_directory_objects(aws_k8s, fsx_facts())
    job = next(o for o in objects if o["kind"] == "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    for team in ("research", "product", "eval"):
        assert f"/shared/teams/{team}" in container["command"][-1]
    root = next(o for o in objects if o["kind"] == "PersistentVolume")
    assert root["spec"]["csi"]["volumeAttributes"]["mountname"] == "abcdef"
    assert root["spec"]["claimRef"]["namespace"] == job["metadata"]["namespace"] == "gpuplat-system"


def test_a_team_added_on_day_2_gets_a_new_directories_job(aws_k8s: ResolvedPlatform) -> None:
    """A Job's pod template is immutable: the same name with another team list would be refused by
    `kubectl apply` (and never run again); the same teams keep the same Job."""

    def job_name(platform: ResolvedPlatform) -> str:
        return next(o for o in team_directory_objects(platform, fsx_facts()) if o["kind"] == "Job")[
            "metadata"
        ]["name"]

    more = aws_k8s.spec.model_copy(deep=True)
    more.scheduler.teams.append(more.scheduler.teams[-1].model_copy(update={"name": "vision"}))
    assert job_name(aws_k8s) == job_name(aws_k8s)
    assert job_name(dataclasses.replace(aws_k8s, spec=more)) != job_name(aws_k8s)


def test_a_stack_of_spot_training_pools_creates_the_directories_on_spot(
    write_stack: Callable[..., Path],
) -> None:
    def spot_only(platform: dict[str, Any]) -> None:
        platform["pools"] = [p for p in platform["pools"] if p["name"] != "train"]
        for team in platform["scheduler"]["teams"]:
            team.pop("spot_gpu_quota", None)

    platform = load_platform(write_stack("aws-k8s", spot_only))
    job = next(o for o in team_directory_objects(platform, fsx_facts()) if o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {LABEL_POOL: "train-spot"}


def test_training_environment_is_the_nodes_nccl_conf_with_the_pods_interface() -> None:
    aws = training_environment(load_platform(stack_file("aws-k8s")))
    assert aws["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in aws
    assert aws["GPUPLAT_CHECKPOINT_DIR"] == "/fsx/checkpoints"
    onprem = training_environment(load_platform(stack_file("onprem")))
    assert onprem["NCCL_IB_DISABLE"] == "0"
    assert onprem["NCCL_SOCKET_IFNAME"] == "eth0"  # bond0 is a host interface, absent in a pod
    assert "FI_PROVIDER" not in onprem


def test_example_job_asks_for_whole_nodes_with_their_efa_devices(aws_k8s: ResolvedPlatform) -> None:
    job = example_jobset(aws_k8s, "research")
    assert job["metadata"]["namespace"] == "team-research"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "gpuplat-training"}}]


def test_the_example_job_runs_the_slurm_example_with_the_task_prolog_settings(
    aws_k8s: ResolvedPlatform,
) -> None:
    """Same program and arguments as examples/train_dist/train.sbatch; what Slurm's TaskProlog gives a task
    (OpenMP threads per GPU worker, NCCL's log on the first attempt) the pod sets itself; a drained spot
    node leaves it Slurm's spot grace time to save."""
    pod = example_jobset(aws_k8s, "research")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]
    container = pod["containers"][0]
    script = container["command"][-1]
    assert EXAMPLE_PROGRAM.endswith("train_dist/train.py")
    assert (ROOT / "examples" / "train_dist" / "train.py").is_file()
    assert f"/fsx/{EXAMPLE_PROGRAM} --dir $(GPUPLAT_CHECKPOINT_DIR)/$(JOBSET_NAME)" in script
    assert "$$(( POD_CPUS / 8" in script and "OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}" in script
    assert '[ "$JOBSET_RESTART_ATTEMPT" = 0 ]' in script and "NCCL_DEBUG=INFO" in script
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert (
        env["JOBSET_RESTART_ATTEMPT"]["fieldRef"]["fieldPath"]
        == f"metadata.labels['{RESTART_ATTEMPT_LABEL}']"
    )
    assert env["POD_CPUS"]["resourceFieldRef"] == {"containerName": "trainer", "resource": "limits.cpu"}
    assert pod["terminationGracePeriodSeconds"] == SPOT_GRACE_TIME_S
    timeout = int(re.search(r"--shutdown-timeout=(\d+) ", script).group(1))  # type: ignore[union-attr]
    assert 30 < timeout < SPOT_GRACE_TIME_S  # torchrun's default of 30 s would SIGKILL a slow save
    assert training_environment(aws_k8s)["GPUPLAT_CHECKPOINT_EVERY"] == "50"


def test_every_team_example_passes_the_baseline_pod_security_level(aws_k8s: ResolvedPlatform) -> None:
    """What `baseline` refuses (pod-security-standards, Baseline): host namespaces, privileged containers,
    hostPath volumes, host ports, added capabilities; the examples the docs hand out use none."""
    for team in aws_k8s.spec.scheduler.teams:
        job = example_jobset(aws_k8s, team.name)
        pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert not any("hostPath" in v for v in pod["volumes"])
        for container in pod["containers"]:
            context = container.get("securityContext", {})
            assert not context.get("privileged") and not context.get("capabilities", {}).get("add")
            assert not any("hostPort" in p for p in container.get("ports", []))
