"""The teams' directories on the shared filesystem (teams/<team>, infra.k8s.tenancy): each team's pods
mount only its own, so someone has to create them. A Job in the platform's system namespace mounts the
filesystem's root and creates every team's directory (mkdir -p: a second run, or a team added on day 2,
changes nothing that exists). A team pod scheduled before the Job ran waits: the kubelet retries the
mount until the directory exists."""

from __future__ import annotations

import hashlib

from infra.k8s.facts import ClusterFacts
from infra.k8s.objects import LABEL_POOL, SYSTEM_NAMESPACE, Manifest, k8s_object, tolerations
from infra.k8s.tenancy import shared_volume_objects, team_directory
from infra.k8s.training import SHARED_CLAIM
from infra.platform.resolve import ResolvedPlatform
from infra.scheduling.placement import training_order

JOB_NAME = "team-directories"
# A shell and mkdir, nothing else: https://hub.docker.com/_/busybox (1.37.0, the stable release).
UTILITY_IMAGE = "docker.io/library/busybox:1.37.0"
MOUNT = "/shared"


def team_directory_objects(platform: ResolvedPlatform, facts: ClusterFacts) -> list[Manifest]:
    # On a training node: those mount the filesystem (the FSx node plugin tolerates every taint; on an
    # existing cluster the shared_fs role mounts it on the GPU hosts).
    # On-demand first (the Job is not interrupted there); a stack whose training pools are all spot, spot.
    pools = training_order(platform)
    pool = next((p for p in pools if p.spec.capacity != "spot"), pools[0])
    directories = [f"{MOUNT}/{team_directory(t.name)}" for t in platform.spec.scheduler.teams]
    # 0770 would need the teams' uids; only the team's own pods ever mount its directory.
    command = f"mkdir -p {' '.join(directories)} && chmod 0777 {' '.join(directories)}"
    pod = {
        "spec": {
            "restartPolicy": "OnFailure",
            "nodeSelector": {LABEL_POOL: pool.name},
            "tolerations": tolerations(pool),
            "containers": [
                {
                    "name": "mkdir",
                    "image": UTILITY_IMAGE,
                    "command": ["/bin/sh", "-c", command],
                    "volumeMounts": [{"name": SHARED_CLAIM, "mountPath": MOUNT}],
                }
            ],
            "volumes": [{"name": SHARED_CLAIM, "persistentVolumeClaim": {"claimName": SHARED_CLAIM}}],
        }
    }
    # A Job's pod template cannot change (the API refuses it: `kubectl apply` of the manifests would fail
    # on day 2 when a team is added), so its name carries the directories: a new team list is a new Job.
    digest = hashlib.sha256(command.encode()).hexdigest()[:8]
    job = k8s_object(
        "batch/v1",
        "Job",
        f"{JOB_NAME}-{digest}",
        SYSTEM_NAMESPACE,
        spec={"backoffLimit": 20, "template": pod},
    )
    return [
        k8s_object("v1", "Namespace", SYSTEM_NAMESPACE),
        *shared_volume_objects(platform, facts.shared_volume, SYSTEM_NAMESPACE),
        job,
    ]
