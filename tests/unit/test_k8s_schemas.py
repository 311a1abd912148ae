"""The offline Kubernetes checker refuses what the API server would refuse, and never passes what it
could not evaluate."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s_schemas import (
    CRD_DIRECTORY_ENV,
    CrdDirectoryMissing,
    assert_accepted,
    compile_cel,
    evaluate_admission,
    require_crds,
    validate,
)

Manifest = dict[str, Any]


@pytest.fixture
def crds() -> Path:
    return require_crds()


def namespace() -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}


def deployment() -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a", "labels": {"gpuplat/team": "a"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]
                },
            },
        },
    }


def cluster_queue(api_version: str = "kueue.x-k8s.io/v1beta2") -> Manifest:
    return {
        "apiVersion": api_version,
        "kind": "ClusterQueue",
        "metadata": {"name": "gpu"},
        "spec": {
            "namespaceSelector": {},
            "cohortName": "platform",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [
                                {"name": "cpu", "nominalQuota": 192},
                                {"name": "nvidia.com/gpu", "nominalQuota": 16},
                            ],
                        }
                    ],
                }
            ],
        },
    }


def gpu_quota(queue: Manifest) -> dict[str, Any]:
    resources: list[dict[str, Any]] = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return resources[1]


# --------------------------------------------------------------------------------------- built-in kinds


def test_valid_namespace_and_deployment_pass() -> None:
    for manifest in (namespace(), deployment()):
        report = validate(manifest)
        assert report.errors == []
        assert report.ok


def test_unknown_field_in_a_deployment_fails_naming_object_and_path() -> None:
    manifest = deployment()
    manifest["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"

    report = validate(manifest)

    assert not report.ok
    assert report.errors == [
        "Deployment team-a/web: $.spec.template.spec.containers[0]: "
        "Additional properties are not allowed ('imagePullPolicyy' was unexpected)"
    ]


def test_wrong_type_in_a_deployment_fails() -> None:
    manifest = deployment()
    manifest["spec"]["replicas"] = "two"

    assert [e for e in validate(manifest).errors if "$.spec.replicas" in e]


def test_unknown_kind_fails() -> None:
    report = validate({"apiVersion": "v1", "kind": "Gadget", "metadata": {"name": "x"}})

    assert len(report.errors) == 1
    assert "no schema for v1 Gadget" in report.errors[0]


def test_kind_of_another_group_is_not_taken_for_the_built_in_one(crds: Path) -> None:
    manifest = deployment()
    manifest["apiVersion"] = "apps.example.com/v1"

    report = validate(manifest)

    assert len(report.errors) == 1
    assert "no schema for apps.example.com/v1 Deployment" in report.errors[0]


def test_kind_missing_from_the_requested_kubernetes_version_fails(crds: Path) -> None:
    # admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA from Kubernetes 1.30 on.
    policy = inference_toleration_policy()

    assert validate(policy, "1.30").ok
    assert (
        "no schema for admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"
        in validate(policy, "1.29").errors[0]
    )


def test_unsupported_kubernetes_version_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Kubernetes 1\.24"):
        validate(namespace(), "1.24")


@pytest.mark.parametrize(
    ("kind", "name", "accepted"),
    [
        ("Namespace", "team-a", True),
        ("Namespace", "team.a", False),  # a DNS-1123 label: no dots
        ("Service", "1web", False),  # a DNS-1035 label: starts with a letter
        ("ConfigMap", "team.a", True),  # a DNS-1123 subdomain
        ("ConfigMap", "Team", False),
        ("ClusterRole", "system:gpuplat:reader", True),  # a path segment name
        ("ClusterRole", "a/b", False),
    ],
)
def test_metadata_name_follows_the_rule_of_its_kind(kind: str, name: str, accepted: bool) -> None:
    api_version = "rbac.authorization.k8s.io/v1" if kind == "ClusterRole" else "v1"
    manifest: Manifest = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}

    errors = [e for e in validate(manifest).errors if "$.metadata.name" in e]

    assert (errors == []) is accepted


def test_missing_name_and_bad_labels_fail() -> None:
    manifest = namespace()
    del manifest["metadata"]["name"]
    manifest["metadata"]["labels"] = {"gpuplat/team/x": "a", "gpuplat/pool": "not a value"}

    errors = validate(manifest).errors

    assert any("$.metadata.name: metadata.name is required" in e for e in errors)
    assert any("$.metadata.labels.gpuplat/team/x: label key" in e for e in errors)
    assert any("label value 'not a value'" in e for e in errors)


# ------------------------------------------------------------------------------------ custom resources


def test_valid_cluster_queue_passes_with_its_cel_rules_evaluated(crds: Path) -> None:
    report = assert_accepted(cluster_queue())

    assert report.warnings == []
    # spec, spec.flavorFungibility and spec.preemption (both defaulted) and spec.resourceGroups[0]
    assert (report.cel.evaluated, report.cel.passed, report.cel.failed) == (4, 4, 0)
    assert report.cel.not_evaluated == []


def test_unknown_field_nested_in_a_cluster_queue_fails(crds: Path) -> None:
    queue = cluster_queue()
    gpu_quota(queue)["nominalQuotaa"] = 16

    errors = validate(queue).errors

    assert errors == [
        "ClusterQueue gpu: $.spec.resourceGroups[0].flavors[0].resources[1]: "
        "Additional properties are not allowed ('nominalQuotaa' was unexpected)"
    ]


def test_unknown_metadata_field_of_a_custom_resource_fails(crds: Path) -> None:
    queue = cluster_queue()
    queue["metadata"]["labelz"] = {}

    assert any("$.metadata" in e and "'labelz' was unexpected" in e for e in validate(queue).errors)


def test_cluster_queue_breaking_a_crd_cel_rule_fails_with_the_rule_message(crds: Path) -> None:
    queue = cluster_queue()
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()

    report = validate(queue)

    assert len(report.errors) == 1
    assert report.errors[0].startswith(
        "ClusterQueue gpu: $.spec.resourceGroups[0]: "
        "flavors must have the same number of resources as the coveredResources"
    )
    assert (report.cel.evaluated, report.cel.passed, report.cel.failed) == (4, 3, 1)


def test_cel_rules_see_the_schema_defaults(crds: Path) -> None:
    # whenCanPreempt defaults to TryNextFlavor: only with the default applied does the rule hold.
    queue = cluster_queue()
    queue["spec"]["flavorFungibility"] = {
        "preference": "BorrowingOverPreemption",
        "whenCanBorrow": "TryNextFlavor",
    }
    assert_accepted(queue)

    # whenCanBorrow defaults to MayStopSearch, which the rule refuses with a preference set.
    queue["spec"]["flavorFungibility"] = {"preference": "BorrowingOverPreemption"}
    errors = validate(queue).errors
    assert len(errors) == 1
    assert "$.spec.flavorFungibility: preference can only be set when both whenCanBorrow" in errors[0]


@pytest.mark.parametrize("quota", [16, "16", "640Gi", "1.5"])
def test_int_or_string_quantity_accepts_both(crds: Path, quota: Any) -> None:
    queue = cluster_queue()
    gpu_quota(queue)["nominalQuota"] = quota

    assert validate(queue).errors == []


@pytest.mark.parametrize("quota", [True, 1.5, "sixteen", {"value": 16}])
def test_int_or_string_quantity_refuses_anything_else(crds: Path, quota: Any) -> None:
    queue = cluster_queue()
    gpu_quota(queue)["nominalQuota"] = quota

    assert any("nominalQuota" in e for e in validate(queue).errors)


def test_version_the_crd_does_not_serve_fails(crds: Path) -> None:
    report = validate(cluster_queue("kueue.x-k8s.io/v1alpha1"))

    assert report.errors == [
        "ClusterQueue gpu: $.apiVersion: kueue.x-k8s.io/v1alpha1 is not served by the ClusterQueue CRD "
        "(kueue.x-k8s.io_clusterqueues.yaml); served: kueue.x-k8s.io/v1beta1, kueue.x-k8s.io/v1beta2"
    ]


def test_deprecated_served_version_passes_with_a_warning(crds: Path) -> None:
    # Kueue v0.19.2 still serves v1beta1 (deprecated); v1beta1 names the cohort `cohort`, not `cohortName`.
    queue = cluster_queue("kueue.x-k8s.io/v1beta1")
    queue["spec"]["cohort"] = queue["spec"].pop("cohortName")

    report = validate(queue)

    assert report.errors == []
    assert report.warnings == ["ClusterQueue gpu: This version is deprecated. Use v1beta2 instead."]


def test_namespace_on_a_cluster_scoped_custom_resource_fails(crds: Path) -> None:
    queue = cluster_queue()
    queue["metadata"]["namespace"] = "team-a"

    assert "ClusterQueue team-a/gpu: $.metadata.namespace: not allowed on a cluster-scoped kind" in (
        validate(queue).errors
    )


def test_duplicate_key_in_a_map_list_fails(crds: Path) -> None:
    queue = cluster_queue()
    queue["spec"]["admissionChecksStrategy"] = {
        "admissionChecks": [{"name": "provisioning"}, {"name": "provisioning"}]
    }

    errors = validate(queue).errors

    assert errors == [
        "ClusterQueue gpu: $.spec.admissionChecksStrategy.admissionChecks[1]: "
        'Duplicate value: {"name": "provisioning"}'
    ]


def ec2_node_class(alias: str) -> Manifest:
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": "gpu"},
        "spec": {
            "role": "KarpenterNodeRole-gpuplat",
            "amiSelectorTerms": [{"alias": alias}],
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "gpuplat"}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "gpuplat"}}],
        },
    }


def test_rules_using_kubernetes_string_and_regex_functions_are_evaluated(crds: Path) -> None:
    # Karpenter's rules call split() (cel-go strings extension) and find() (Kubernetes regex library).
    report = assert_accepted(ec2_node_class("al2023@latest"))
    assert report.cel.evaluated == report.cel.passed > 0

    errors = validate(ec2_node_class("windows2022@v20250101")).errors
    assert len(errors) == 1
    assert "$.spec.amiSelectorTerms[0].alias: windows families may only specify version 'latest'" in errors[0]


def test_transition_rules_are_counted_not_evaluated(crds: Path) -> None:
    node_pool: Manifest = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": "gpu"},
        "spec": {
            "template": {
                "metadata": {"labels": {"gpuplat/pool": "gpu"}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": ["p5.48xlarge"],
                        }
                    ],
                },
            }
        },
    }

    report = assert_accepted(node_pool)

    assert report.cel.not_evaluated
    assert all(n.transition_rule and "oldSelf" in n.rule for n in report.cel.not_evaluated)
    assert report.cel.evaluated == report.cel.passed > 0


def write_crd(directory: Path, rules: list[dict[str, str]]) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "sizes": {"type": "array", "items": {"type": "integer"}},
                                        "surge": {"x-kubernetes-int-or-string": True},
                                    },
                                    "x-kubernetes-validations": rules,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
    (directory / "example.com_widgets.yaml").write_text(yaml.safe_dump(crd))


def test_rules_celpy_cannot_run_are_never_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_crd(
        tmp_path,
        [
            {"rule": "self.sizes.isSorted()", "message": "sorted"},  # Kubernetes list library
            {"rule": "self.?sizes.orValue([]).size() > 0", "message": "optional"},  # CEL optional syntax
            {"rule": "size(self.sizes) > 0", "message": "sizes must not be empty"},
            {"rule": "self.sizes.all(s, s > 0)", "messageExpression": "'sizes must be positive'"},
        ],
    )
    monkeypatch.setenv(CRD_DIRECTORY_ENV, str(tmp_path))
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "a"}}

    report = validate({**widget, "spec": {"sizes": [2, 0]}})

    assert (report.cel.evaluated, report.cel.passed, report.cel.failed) == (2, 1, 1)
    assert report.errors == [
        "Widget a/w: $.spec: sizes must be positive (x-kubernetes-validations rule: self.sizes.all(s, s > 0))"
    ]
    reasons = {n.rule: n.reason for n in report.cel.not_evaluated}
    assert reasons["self.sizes.isSorted()"].startswith("calls isSorted, which celpy lacks")
    assert reasons["self.?sizes.orValue([]).size() > 0"].startswith("celpy cannot parse it")
    with pytest.raises(AssertionError, match="not evaluated"):
        assert_accepted({**widget, "spec": {"sizes": [1, 2]}})


@pytest.mark.parametrize(
    ("surge", "accepted"), [(1, True), ("25%", True), (True, False), (0.5, False), ([], False)]
)
def test_int_or_string_without_any_of_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, surge: Any, accepted: bool
) -> None:
    write_crd(tmp_path, [])
    monkeypatch.setenv(CRD_DIRECTORY_ENV, str(tmp_path))
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"surge": surge},
    }

    assert validate(widget).ok is accepted


def test_missing_crd_folder_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-crds"
    monkeypatch.setenv(CRD_DIRECTORY_ENV, str(missing))

    with pytest.raises(pytest.fail.Exception) as raised:
        require_crds()
    assert str(missing) in str(raised.value)
    with pytest.raises(CrdDirectoryMissing, match=str(missing)):
        validate(cluster_queue())


# -------------------------------------------------------------------------- ValidatingAdmissionPolicy


def inference_toleration_policy() -> Manifest:
    """Refuse pods outside the serving namespace that tolerate the inference pools' taint."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "gpuplat-inference-toleration"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["serving"]}
                    ]
                },
            },
            "variables": [
                {
                    "name": "tolerations",
                    "expression": "has(object.spec.tolerations) ? object.spec.tolerations : []",
                }
            ],
            "validations": [
                {
                    "expression": "!variables.tolerations.exists(t, has(t.key) ? t.key == 'gpuplat/inference'"
                    " : has(t.operator) && t.operator == 'Exists')",
                    "messageExpression": "'pod ' + object.metadata.name + ' tolerates gpuplat/inference'",
                    "reason": "Forbidden",
                }
            ],
        },
    }


def pod(tolerations: list[dict[str, str]], namespace: str = "team-a") -> Manifest:
    spec: dict[str, Any] = {"containers": [{"name": "train", "image": "trainer:1"}]}
    if tolerations:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": spec,
    }


INFERENCE_TOLERATION = {"key": "gpuplat/inference", "operator": "Exists", "effect": "NoSchedule"}


def test_policy_is_valid_against_the_strict_schema_and_its_cel_parses() -> None:
    policy = inference_toleration_policy()

    report = assert_accepted(policy)

    assert report.errors == []
    broken = copy.deepcopy(policy)
    broken["spec"]["validations"][0]["expresion"] = "true"
    assert any("'expresion' was unexpected" in e for e in validate(broken).errors)


def test_policy_refuses_a_pod_tolerating_the_inference_taint() -> None:
    for tolerations in ([INFERENCE_TOLERATION], [{"operator": "Exists"}]):
        result = evaluate_admission(inference_toleration_policy(), pod(tolerations), namespace_labels={})

        assert result.matched
        assert result.failures == ["pod train tolerates gpuplat/inference"]
        assert result.admitted is False


def test_policy_admits_pods_without_the_toleration_or_in_the_serving_namespace() -> None:
    policy = inference_toleration_policy()
    other = {"key": "gpuplat/pool", "operator": "Equal", "value": "train", "effect": "NoSchedule"}

    for tolerations in ([], [other]):
        result = evaluate_admission(policy, pod(tolerations), namespace_labels={})
        assert (result.matched, result.failures, result.admitted) == (True, [], True)

    serving = evaluate_admission(policy, pod([INFERENCE_TOLERATION], "serving"), namespace_labels={})
    assert (serving.matched, serving.admitted) == (False, True)


def test_binding_that_only_warns_does_not_refuse() -> None:
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "gpuplat-inference-toleration"},
        "spec": {"policyName": "gpuplat-inference-toleration", "validationActions": ["Warn"]},
    }
    assert validate(binding).ok

    result = evaluate_admission(
        inference_toleration_policy(), pod([INFERENCE_TOLERATION]), {}, binding=binding
    )

    assert (result.failures, result.warnings, result.admitted) == (
        [],
        ["pod train tolerates gpuplat/inference"],
        True,
    )


def test_policy_expression_celpy_cannot_run_is_not_evaluated() -> None:
    policy = inference_toleration_policy()
    policy["spec"]["validations"].append({"expression": "object.spec.containers.map(c, c.name).isSorted()"})

    result = evaluate_admission(policy, pod([]), namespace_labels={})

    assert result.failures == []
    assert [n.reason for n in result.not_evaluated] == [
        "calls isSorted, which celpy lacks (Kubernetes CEL libraries)"
    ]
    assert result.admitted is None


def test_compile_cel_reports_parse_errors() -> None:
    assert compile_cel("has(object.spec.tolerations)") is None
    assert compile_cel("object.spec.tolerations.exists(t,") is not None

    policy = inference_toleration_policy()
    policy["spec"]["validations"][0]["expression"] = "object.spec.("
    report = validate(policy)
    assert report.errors == []
    assert [n.path for n in report.cel.not_evaluated] == ["$.spec.validations[0].expression"]
