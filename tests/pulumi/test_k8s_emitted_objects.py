"""Every Kubernetes object the Kueue stacks emit, read back from the recording of the real program, as
the API server of the stack's Kubernetes version would judge it: strict schemas (unknown fields fail),
CRDs of the pinned releases with their CEL rules, and the semantics no schema states."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from infra.k8s.isolation import POLICY_NAME
from infra.k8s.training import example_jobset
from infra.plan.record import record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.k8s_schemas import assert_accepted, evaluate_admission, require_crds

KUEUE_STACKS = ("aws-k8s", "onprem-k8s")


@cache
def emitted(stack: str) -> tuple[ResolvedPlatform, list[dict[str, Any]]]:
    platform = load_platform(stack_file(stack))
    resources = record(platform).resources
    objects = [r.inputs for r in resources if r.type.startswith("kubernetes:") and "kind" in r.inputs]
    return platform, [o for o in objects if o["kind"] != "Node"]


def version(platform: ResolvedPlatform) -> str:
    assert platform.spec.kubernetes is not None
    return platform.spec.kubernetes.version


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_every_emitted_object_is_accepted_strictly(stack: str) -> None:
    require_crds()
    platform, objects = emitted(stack)
    assert len(objects) > 30
    evaluated = 0
    for manifest in objects:
        evaluated += assert_accepted(manifest, version(platform)).cel.evaluated
    assert evaluated > 0, "no CRD rule was evaluated: the CEL check is not running"


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_example_jobs_are_accepted_strictly(stack: str) -> None:
    require_crds()
    platform, _ = emitted(stack)
    for team in platform.spec.scheduler.teams:
        assert_accepted(example_jobset(platform, team.name), version(platform))


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_no_kueue_v1beta1_and_every_object_named(stack: str) -> None:
    _, objects = emitted(stack)
    assert not [o for o in objects if o["apiVersion"] == "kueue.x-k8s.io/v1beta1"]
    assert all(o["metadata"].get("name") for o in objects)


@pytest.mark.parametrize("stack", KUEUE_STACKS)
def test_every_reference_resolves(stack: str) -> None:
    _, objects = emitted(stack)
    names = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}
    namespaces = {name for kind, _, name in names if kind == "Namespace"} | {"kube-system", "default"}
    for o in objects:
        assert o["metadata"].get("namespace", "default") in namespaces, o["metadata"]
        spec = o.get("spec", {})
        if o["kind"] == "LocalQueue":
            assert ("ClusterQueue", None, spec["clusterQueue"]) in names
        if o["kind"] == "ClusterQueue":
            assert ("Cohort", None, spec["cohortName"]) in names
            for flavor in spec["resourceGroups"][0]["flavors"]:
                assert ("ResourceFlavor", None, flavor["name"]) in names
        if o["kind"] == "ResourceFlavor" and "topologyName" in spec:
            assert ("Topology", None, spec["topologyName"]) in names
        if o["kind"] == "PersistentVolumeClaim":
            assert ("PersistentVolume", None, spec["volumeName"]) in names
        if o["kind"] == "ValidatingAdmissionPolicyBinding":
            assert ("ValidatingAdmissionPolicy", None, spec["policyName"]) in names
        if o["kind"] == "ScaledObject":
            target = spec["scaleTargetRef"]
            assert (target.get("kind", "Deployment"), o["metadata"]["namespace"], target["name"]) in names


def _policy(stack: str) -> tuple[dict[str, Any], dict[str, Any]]:
    _, objects = emitted(stack)
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy")
    binding = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding")
    assert policy["metadata"]["name"] == POLICY_NAME
    return policy, binding


def _pod(**spec: Any) -> dict[str, Any]:
    container = {"name": "trainer", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": 8}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "job-0", "namespace": "team-research"},
        "spec": {"containers": [container], **spec},
    }


TEAM = {"gpuplat/team": "research"}
INFERENCE_TOLERATION = {
    "key": "gpuplat/inference",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}


@pytest.mark.parametrize(
    ("pod", "admitted"),
    [
        (_pod(), True),
        (_pod(tolerations=[{"key": "gpuplat/spot", "operator": "Exists", "effect": "NoSchedule"}]), True),
        (_pod(nodeSelector={"gpuplat/pool": "train"}), True),
        (_pod(tolerations=[INFERENCE_TOLERATION]), False),
        (_pod(tolerations=[{"operator": "Exists"}]), False),
        (_pod(nodeSelector={"gpuplat/pool": "infer"}), False),
        (_pod(nodeSelector={"gpuplat/role": "infer"}), False),
        (_pod(nodeName="gpu-21"), False),
        (
            _pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "gpuplat/pool", "operator": "In", "values": ["infer"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            ),
            False,
        ),
    ],
)
def test_the_api_server_refuses_team_pods_aimed_at_inference_nodes(
    pod: dict[str, Any], admitted: bool
) -> None:
    policy, binding = _policy("onprem-k8s")
    result = evaluate_admission(policy, pod, TEAM, binding=binding)
    assert result.matched
    assert result.admitted is admitted, (result.failures, result.not_evaluated)


def test_the_policy_leaves_the_serving_namespace_alone() -> None:
    policy, binding = _policy("aws-k8s")
    pod = _pod(tolerations=[INFERENCE_TOLERATION])
    pod["metadata"]["namespace"] = "serving"
    assert not evaluate_admission(policy, pod, {}, binding=binding).matched
