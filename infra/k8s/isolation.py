"""Training and inference never share nodes, enforced by the API server: a ValidatingAdmissionPolicy
refuses any pod of a team namespace that tolerates an inference pool's taint, selects an inference
pool by label or required node affinity, or names its node itself (a pod with spec.nodeName skips the
scheduler, and with it every taint)."""

from __future__ import annotations

import json

from infra.k8s.objects import LABEL_POOL, LABEL_ROLE, LABEL_TEAM, Manifest, k8s_object
from infra.platform.resolve import ResolvedPlatform

ADMISSION_API = "admissionregistration.k8s.io/v1"
POLICY_NAME = "gpuplat-training-off-inference"


def _cel_list(values: list[str]) -> str:
    return json.dumps(sorted(values))


def _validations(platform: ResolvedPlatform) -> list[dict[str, str]]:
    infer = platform.pools_with_role("infer")
    pools = _cel_list([p.name for p in infer])
    taint_keys = _cel_list(sorted({t.key for p in infer for t in p.spec.taints}))
    selects_inference = (
        f"(e.key == '{LABEL_ROLE}' && e.operator == 'In' && e.values.exists(v, v == 'infer')) || "
        f"(e.key == '{LABEL_POOL}' && e.operator == 'In' && e.values.exists(v, v in {pools}))"
    )
    return [
        {
            "expression": "!has(object.spec.tolerations) || object.spec.tolerations.all(t, "
            f"has(t.key) ? !(t.key in {taint_keys}) : !(has(t.operator) && t.operator == 'Exists'))",
            "message": "team pods may not tolerate the inference pools' taints (nor every taint): "
            "training and inference never share nodes",
            "reason": "Forbidden",
        },
        {
            "expression": "!has(object.spec.nodeSelector) || !("
            f"(('{LABEL_ROLE}' in object.spec.nodeSelector) && "
            f"object.spec.nodeSelector['{LABEL_ROLE}'] == 'infer') || "
            f"(('{LABEL_POOL}' in object.spec.nodeSelector) && "
            f"object.spec.nodeSelector['{LABEL_POOL}'] in {pools}))",
            "message": "team pods may not select inference nodes (nodeSelector)",
            "reason": "Forbidden",
        },
        {
            "expression": "!has(object.spec.affinity) || !has(object.spec.affinity.nodeAffinity) || "
            "!has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) || "
            "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms.all(term, !has(term.matchExpressions) || "
            f"!term.matchExpressions.exists(e, {selects_inference}))",
            "message": "team pods may not require inference nodes (node affinity)",
            "reason": "Forbidden",
        },
        {
            "expression": "request.operation != 'CREATE' || !has(object.spec.nodeName)",
            "message": "team pods may not name their node (spec.nodeName bypasses the scheduler and taints)",
            "reason": "Forbidden",
        },
    ]


def isolation_objects(platform: ResolvedPlatform) -> list[Manifest]:
    team_namespaces = {"matchExpressions": [{"key": LABEL_TEAM, "operator": "Exists"}]}
    policy = k8s_object(
        ADMISSION_API,
        "ValidatingAdmissionPolicy",
        POLICY_NAME,
        spec={
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": team_namespaces,
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods"],
                    }
                ],
            },
            "validations": _validations(platform),
        },
    )
    binding = k8s_object(
        ADMISSION_API,
        "ValidatingAdmissionPolicyBinding",
        POLICY_NAME,
        spec={"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    )
    return [policy, binding]
