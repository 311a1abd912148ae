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


def _namespace(team: Team) -> Manifest:
    return k8s_object("v1", "Namespace", team_namespace(team.name), labels={LABEL_TEAM: team.name})


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


def _volume_source(volume: SharedVolume) -> dict[str, Any]:
    if volume.kind == "fsx-csi":
        attributes = volume.attributes
        return {
            "csi": {
                "driver": FSX_CSI_DRIVER,
                "volumeHandle": attributes["file_system_id"],
                "volumeAttributes": {
                    "dnsname": attributes["dns_name"],
                    "mountname": attributes["mount_name"],
                },
            }
        }
    return {"hostPath": {"path": volume.mount_path, "type": "Directory"}}


def shared_volume_objects(platform: ResolvedPlatform, volume: SharedVolume, namespace: str) -> list[Manifest]:
    """A static PersistentVolume of the shared filesystem bound to the claim `shared` in `namespace`
    (a volume binds to one claim: one volume per namespace, all on the same filesystem)."""
    name = f"{platform.name}-{namespace}-shared"
    size = f"{volume.capacity_tib:g}Ti"
    volume_object = k8s_object(
        "v1",
        "PersistentVolume",
        name,
        spec={
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": SHARED_CLAIM},
            **_volume_source(volume),
        },
    )
    claim = k8s_object(
        "v1",
        "PersistentVolumeClaim",
        SHARED_CLAIM,
        namespace,
        spec={
            "accessModes": ["ReadWriteMany"],
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
        objects += shared_volume_objects(platform, facts.shared_volume, team_namespace(team.name))
    return objects
