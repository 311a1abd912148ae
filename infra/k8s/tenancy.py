"""Per team: its namespace, who may use it, the GPU cap as a ResourceQuota (a backstop behind Kueue,
and the cap across flavors), a default-deny network policy that lets the team's pods talk to each
other (NCCL) and monitoring scrape them, the training environment, and the shared filesystem."""

from __future__ import annotations

from typing import Any

from infra.k8s.facts import ClusterFacts, SharedVolume
from infra.k8s.objects import (
    GPU_RESOURCE,
    LABEL_TEAM,
    Manifest,
    k8s_object,
    monitoring_peer,
    team_namespace,
)
from infra.k8s.operators import KUEUE_RELEASE
from infra.k8s.training import SHARED_CLAIM, training_config
from infra.platform.resolve import ResolvedPlatform
from infra.spec.models import Team

# The aggregated ClusterRole Kubernetes ships for read/write use of a namespace (no RBAC or quota edits),
# and Kueue's role for batch users: it aggregates the chart's editor roles of every job kind Kueue runs,
# JobSets included, which nothing aggregates into `edit` (Kueue's jobset editor carries only the
# batch-user label, JobSet's own chart none: charts/kueue/templates/rbac/batch_user_role.yaml and
# jobset_editor_role.yaml at v0.19.2; charts/jobset/templates/rbac/jobset_editor_role.yaml at v0.12.0).
# Its name is `<fullname>-batch-user-role`, the fullname the release name "kueue" (_helpers.tpl:29-40).
TEAM_CLUSTER_ROLES = ("edit", f"{KUEUE_RELEASE}-batch-user-role")
FSX_CSI_DRIVER = "fsx.csi.aws.com"
# Each team's pods mount only its own directory of the shared filesystem, teams/<team> (at the
# filesystem's mount path inside the pod, so paths of the stack such as checkpoint_path hold there).
TEAM_DIRECTORIES = "teams"


# Pod Security Admission (built in since Kubernetes 1.25): `baseline` refuses privileged pods, host
# namespaces, hostPath volumes and added capabilities beyond the default set
# (https://kubernetes.io/docs/concepts/security/pod-security-standards/#baseline), which a member with
# `edit` could otherwise run on the shared GPU nodes.
POD_SECURITY_LEVEL = "baseline"


def _namespace(team: Team) -> Manifest:
    labels = {
        LABEL_TEAM: team.name,
        "pod-security.kubernetes.io/enforce": POD_SECURITY_LEVEL,
        "pod-security.kubernetes.io/warn": POD_SECURITY_LEVEL,
    }
    return k8s_object("v1", "Namespace", team_namespace(team.name), labels=labels)


def team_group(team: str) -> str:
    """The Kubernetes group of a team's members: EKS access entries put them in it (teams[].iam_principals);
    other identity providers send it themselves."""
    return f"gpuplat:{team}"


def _role_bindings(team: Team) -> list[Manifest]:
    """The team's users (user names as the cluster's authenticator reports them) and the group
    `gpuplat:<team>` for identity providers that send groups, bound to each TEAM_CLUSTER_ROLES role."""
    subjects = [
        {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"} for user in team.users
    ]
    subjects.append({"kind": "Group", "name": team_group(team.name), "apiGroup": "rbac.authorization.k8s.io"})
    return [
        k8s_object(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            "team-members" if role == "edit" else f"team-members-{role}",
            team_namespace(team.name),
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            subjects=subjects,
        )
        for role in TEAM_CLUSTER_ROLES
    ]


def _gpu_quota(team: Team) -> Manifest:
    return k8s_object(
        "v1",
        "ResourceQuota",
        "gpus",
        team_namespace(team.name),
        spec={"hard": {f"requests.{GPU_RESOURCE}": str(team.gpu_quota)}},
    )


def _network_policy(team: Team) -> Manifest:
    return k8s_object(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "team-only",
        team_namespace(team.name),
        spec={
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}, monitoring_peer()]}],
        },
    )


def team_directory(team: str) -> str:
    """A team's directory on the shared filesystem, relative to its root: all its pods see of it."""
    return f"{TEAM_DIRECTORIES}/{team}"


def _volume_source(volume: SharedVolume, subdirectory: str | None, read_only: bool) -> dict[str, Any]:
    if volume.kind == "fsx-csi":
        attributes = volume.attributes
        # The driver mounts `<dnsname>@tcp:/<mountname>` (pkg/driver/node.go:109-119, aws-fsx-csi-driver
        # 1.9.0, chart 1.17.0), and Lustre mounts a directory of the file system given after the mount
        # name (FSx for Lustre: "Mounting specific filesets",
        # https://docs.aws.amazon.com/fsx/latest/LustreGuide/mounting-on-premises.html).
        mount_name = attributes["mount_name"]
        return {
            "csi": {
                "driver": FSX_CSI_DRIVER,
                # One handle per volume (the driver only requires one; NodeStageVolume is unimplemented).
                "volumeHandle": volume.join(
                    attributes["file_system_id"], f"-{subdirectory.replace('/', '-')}" if subdirectory else ""
                ),
                "readOnly": read_only,
                "volumeAttributes": {
                    "dnsname": attributes["dns_name"],
                    "mountname": volume.join(mount_name, f"/{subdirectory}") if subdirectory else mount_name,
                },
            }
        }
    path = f"{volume.mount_path}/{subdirectory}" if subdirectory else volume.mount_path
    return {"hostPath": {"path": path, "type": "Directory"}}


def shared_volume_objects(
    platform: ResolvedPlatform,
    volume: SharedVolume,
    namespace: str,
    subdirectory: str | None = None,
    read_only: bool = False,
) -> list[Manifest]:
    """A static PersistentVolume of the shared filesystem (or of one directory of it) bound to the claim
    `shared` in `namespace` (a volume binds to one claim: one volume per namespace)."""
    name = f"{platform.name}-{namespace}-shared"
    modes = ["ReadOnlyMany"] if read_only else ["ReadWriteMany"]
    size = f"{volume.capacity_tib:g}Ti"
    volume_object = k8s_object(
        "v1",
        "PersistentVolume",
        name,
        spec={
            "capacity": {"storage": size},
            "accessModes": modes,
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": SHARED_CLAIM},
            **_volume_source(volume, subdirectory, read_only),
        },
    )
    claim = k8s_object(
        "v1",
        "PersistentVolumeClaim",
        SHARED_CLAIM,
        namespace,
        spec={
            "accessModes": modes,
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": {"storage": size}},
        },
    )
    return [volume_object, claim]


def team_objects(platform: ResolvedPlatform, facts: ClusterFacts) -> list[Manifest]:
    objects: list[Manifest] = []
    for team in platform.spec.scheduler.teams:
        objects += [_namespace(team), *_role_bindings(team), _gpu_quota(team), _network_policy(team)]
        objects.append(training_config(platform, team.name))
        objects += shared_volume_objects(
            platform, facts.shared_volume, team_namespace(team.name), team_directory(team.name)
        )
    return objects
