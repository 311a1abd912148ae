"""The guard Job's objects, rendered by the CLI (`serve deploy ... --detach`, `serve guard --detach` on a
Kueue stack) for one release, each named `gpuplat-serve-guard-MODEL-ID` (ID new per release, so that a
finished Job kept for its logs never clashes with the next):

- ConfigMaps: the code (the zip application of infra/serving/guard_job.py and the standard-library
  modules it imports, `binaryData`) and the plan (infra/serving/guard_job_plan.py), both mounted read only;
- a ServiceAccount, and a Role bound to it that grants exactly what the guard calls: `list` on pods (a
  list cannot be limited by name: RBAC's resourceNames do not apply to list, watch, create or
  deletecollection, kubernetes/website content/en/docs/reference/access-authn-authz/rbac.md "Referring to
  resources"), `get`/`update` on its Lease and on its record, `get`/`patch` (server-side apply) on the
  release record and the gateways' Deployment (whose rollout it reads), `patch` only on the gateways'
  ConfigMap (an apply needs no read), and `create` on that ConfigMap (an apply of an object that does not
  exist is authorized as its create, by name: apiserver pkg/endpoints/handlers/patch.go, so a rollback
  makes it again if it was deleted by hand), each by name: tests/unit/test_guard_job.py runs the runner
  under this Role and finds each grant used and nothing wider allowed;
- a NetworkPolicy admitting the guard's pod (its labels) to the gateway pods' metrics port and the model
  servers' port, which the serving namespace's policies admit only to the gateways and monitoring;
- the Job: `restartPolicy: Never` (a pod failure policy "cannot be used in combination with
  restartPolicy=OnFailure": JobSpec.podFailurePolicy in the Kubernetes 1.34 OpenAPI), its rules: a pod
  disrupted (preempted, evicted, its node drained: the `DisruptionTarget` condition) is replaced without
  counting against `backoffLimit`; exit 2 (a plan it cannot read) and exit 10 (another command holds the
  release) fail the Job at once; any other failure is retried, the new pod resuming from the guard's
  record. `activeDeadlineSeconds` covers every step's analysis, its rollout and a rollback's;
  `ttlSecondsAfterFinished` (a day) removes the Job, and with it (their ownerReferences name it: the TTL
  controller deletes the Job with foreground propagation, kubernetes pkg/controller/ttlafterfinished/
  ttlafterfinished_controller.go) every object above, a day after it finished: the guard's record
  (`gpuplat-serve-guard`, which `serve status` reads) stays.

The pod runs the model-server image's own python3 (the vLLM image is a Python one; the stable version's
image, already on the inference nodes it is placed on) on the code ConfigMap; it asks for 50m CPU and
64 MiB and writes nothing to its filesystem.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from infra.k8s.objects import LABEL_COMPONENT, k8s_object
from infra.k8s.release_lock import lease_name
from infra.serving.detach import bundle
from infra.serving.guard_job import GUARD_RECORD, RELEASE_RECORD, SUPERSEDED_EXIT, JobPlan
from infra.serving.pod_counters import PodNames

GUARD_COMPONENT = "serve-guard"
LABEL_GUARD = "gpuplat/serve-guard"
CODE_KEY, PLAN_KEY = "guard.pyz", "plan.json"
CODE_DIR, PLAN_DIR = "/opt/gpuplat-serve-guard", "/etc/gpuplat-serve-guard"
CONTAINER = "guard"
MODULES = (
    "__init__.py",
    "errors/__init__.py",
    "k8s/__init__.py",
    "k8s/api_refs.py",
    "k8s/api_retry.py",
    "k8s/release_lock.py",
    "k8s/rollout.py",
    "k8s/serving_versions.py",
    "serving/__init__.py",
    "serving/analysis.py",
    "serving/carry.py",
    "serving/counts.py",
    "serving/guard_job.py",
    "serving/kube_http.py",
    "serving/load.py",
    "serving/metrics_text.py",
    "serving/pod_counters.py",
    "serving/statistics.py",
)
MAIN = "import sys\nfrom infra.serving.guard_job import main\nsys.exit(main())\n"
BACKOFF_LIMIT = 4
ROLLOUT_S = 600
"""what a share's rollout of the gateway pods may take in the Job (the plan's rollout_s)"""
TTL_S = 86400
NAME_MAX = 63
"""a Job's name is a label value too (batch.kubernetes.io/job-name): 63 characters at most"""


def guard_name(model: str, release_id: str) -> str:
    base = "gpuplat-serve-guard-" + lease_name(model).removeprefix("gpuplat-release-")
    return f"{base[: NAME_MAX - len(release_id) - 1].rstrip('-')}-{release_id}"


def deadline_s(plan: JobPlan) -> int:
    """Every step's analysis (its initial delay, its intervals twice, a look more) and rollout, and a
    rollback's; and the one the Job adds below the stack's smallest share, with its longer intervals (the
    plan's added_interval_s)."""
    rules = plan.rules
    # Each analysis twice over: the servers up moving during it ask its intervals again, at most once
    # (analysis.Analysis.intervals_asked; after that it ends inconclusive).
    analysis = plan.duration_s or rules.initial_delay_s + 2 * rules.analysis_s + plan.look_s
    steps = max(len(rules.steps), 1)
    added = 0.0
    if plan.added_interval_s is not None:
        added_analysis = rules.initial_delay_s + 2 * plan.added_interval_s * rules.intervals + plan.look_s
        added = (plan.duration_s or added_analysis) + plan.rollout_s
    return int((analysis + plan.rollout_s) * steps + added + plan.rollout_s + plan.look_s * 3)


def _labels(name: str) -> dict[str, str]:
    return {LABEL_COMPONENT: GUARD_COMPONENT, LABEL_GUARD: name}


def _role(plan: JobPlan, name: str) -> dict[str, Any]:
    return k8s_object(
        "rbac.authorization.k8s.io/v1",
        "Role",
        name,
        plan.namespace,
        labels=_labels(name),
        rules=[
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [lease_name(plan.model)],
                "verbs": ["get", "update"],
            },
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [GUARD_RECORD, RELEASE_RECORD],
                "verbs": ["get"],
            },
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [GUARD_RECORD],
                "verbs": ["update"],
            },
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [RELEASE_RECORD, *_applied(plan, "ConfigMap")],
                "verbs": ["patch"],
            },
            {
                # An apply of an object that does not exist is authorized as its `create` too, by name
                # (apiserver pkg/endpoints/handlers/patch.go): the gateways' ConfigMap deleted by hand is
                # made again by a rollback. The release record is not: the guard reads it first.
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": _applied(plan, "ConfigMap"),
                "verbs": ["create"],
            },
            {
                "apiGroups": ["apps"],
                "resources": ["deployments"],
                "resourceNames": sorted({plan.gateway, *_applied(plan, "Deployment")}),
                "verbs": ["get", "patch"],
            },
        ],
    )


def _applied(plan: JobPlan, kind: str) -> list[str]:
    """The names of the objects of `kind` the plan's shares apply, the release record aside."""
    return sorted(
        {
            m["metadata"]["name"]
            for objects in plan.shares.values()
            for m in objects
            if m["kind"] == kind and m["metadata"]["name"] != RELEASE_RECORD
        }
    )


def _network_policy(plan: JobPlan, name: str) -> dict[str, Any]:
    names: PodNames = plan.names
    return k8s_object(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        name,
        plan.namespace,
        labels=_labels(name),
        spec={
            "podSelector": {
                "matchExpressions": [
                    {
                        "key": names.component_label,
                        "operator": "In",
                        "values": [names.gateway, names.model_server],
                    }
                ]
            },
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": _labels(name)}}],
                    "ports": [
                        {"protocol": "TCP", "port": names.gateway_port},
                        {"protocol": "TCP", "port": names.server_port},
                    ],
                }
            ],
        },
    )


def _job(plan: JobPlan, name: str, placed: dict[str, Any], image: str) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": name,
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "command": ["python3", f"{CODE_DIR}/{CODE_KEY}", "job", f"{PLAN_DIR}/{PLAN_KEY}"],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "code", "mountPath": CODE_DIR, "readOnly": True},
                    {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {"name": "code", "configMap": {"name": f"{name}-code"}},
            {"name": "plan", "configMap": {"name": f"{name}-plan"}},
        ],
        **{key: placed[key] for key in ("nodeSelector", "tolerations", "affinity") if placed.get(key)},
    }
    return k8s_object(
        "batch/v1",
        "Job",
        name,
        plan.namespace,
        labels=_labels(name),
        spec={
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": deadline_s(plan),
            "ttlSecondsAfterFinished": TTL_S,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER,
                            "operator": "In",
                            "values": [2, SUPERSEDED_EXIT],
                        },
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {"metadata": {"labels": _labels(name)}, "spec": pod_spec},
        },
    )


def guard_objects(plan: JobPlan, name: str, model_server_pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object of the guard Job `name`, the Job last. `model_server_pod`: the stable version's pod
    template spec as rendered (its image and its placement)."""
    image = str(model_server_pod["containers"][0]["image"])
    code = base64.b64encode(bundle(MODULES, MAIN)).decode()
    return [
        k8s_object(
            "v1",
            "ConfigMap",
            f"{name}-code",
            plan.namespace,
            labels=_labels(name),
            binaryData={CODE_KEY: code},
        ),
        k8s_object(
            "v1",
            "ConfigMap",
            f"{name}-plan",
            plan.namespace,
            labels=_labels(name),
            data={PLAN_KEY: json.dumps(plan.to_json(), sort_keys=True)},
        ),
        k8s_object("v1", "ServiceAccount", name, plan.namespace, labels=_labels(name)),
        _role(plan, name),
        k8s_object(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            name,
            plan.namespace,
            labels=_labels(name),
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            subjects=[{"kind": "ServiceAccount", "name": name, "namespace": plan.namespace}],
        ),
        _network_policy(plan, name),
        _job(plan, name, model_server_pod, image),
    ]


def owned_by(manifest: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """`manifest` with the Job as its owner: the garbage collector removes it with the Job."""
    meta = job["metadata"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
    return {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [owner]}}
