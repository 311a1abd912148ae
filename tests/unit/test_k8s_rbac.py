"""The RBAC evaluator the guard Job's tests rely on (tests/k8s_rbac.py), on the cases its sources name."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s_rbac import RequestInfo, allowing_rule, bound_rules, request_info, request_info_of, unused

NS = "/api/v1/namespaces/serving"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", f"{NS}/pods", {"labelSelector": "a=b"}, RequestInfo("list", "", "serving", "pods")),
        ("GET", f"{NS}/pods", {"watch": "1"}, RequestInfo("watch", "", "serving", "pods")),
        ("GET", f"{NS}/pods", {"watch": "false"}, RequestInfo("list", "", "serving", "pods")),
        (
            "GET",
            f"{NS}/pods/p1:8000/proxy/metrics",
            {},
            RequestInfo("get", "", "serving", "pods", "proxy", "p1:8000"),
        ),
        ("POST", f"{NS}/configmaps", {}, RequestInfo("create", "", "serving", "configmaps")),
        ("DELETE", f"{NS}/configmaps", {}, RequestInfo("deletecollection", "", "serving", "configmaps")),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/serving/leases/l",
            {},
            RequestInfo("update", "coordination.k8s.io", "serving", "leases", "", "l"),
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/serving/deployments/gateway",
            {},
            RequestInfo("patch", "apps", "serving", "deployments", "", "gateway"),
        ),
        (
            "GET",
            "/api/v1/namespaces/serving",
            {},
            RequestInfo("get", "", "serving", "namespaces", "", "serving"),
        ),
        ("GET", "/api/v1/nodes", {}, RequestInfo("list", "", "", "nodes")),
    ],
)
def test_a_request_is_read_as_the_api_server_reads_it(
    method: str, path: str, query: dict[str, str], expected: RequestInfo
) -> None:
    assert request_info(method, path, query) == expected


def test_a_path_outside_the_resource_apis_is_refused() -> None:
    with pytest.raises(ValueError, match="no resource request"):
        request_info("GET", "/healthz")


def test_names_limit_a_rule_to_requests_that_carry_one() -> None:
    rules = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["a"],
            "verbs": ["get", "create", "list"],
        },
        {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["*"]},
    ]
    assert allowing_rule(rules, request_info("GET", f"{NS}/configmaps/a")) == 0
    assert allowing_rule(rules, request_info("GET", f"{NS}/configmaps/b")) is None
    # create and list carry no name: a rule with resourceNames never allows them.
    assert allowing_rule(rules, request_info("POST", f"{NS}/configmaps")) is None
    assert allowing_rule(rules, request_info("GET", f"{NS}/configmaps")) is None
    # A subresource needs its own grant: pods/proxy, or */proxy; the resource alone does not give it.
    scale = request_info("PUT", "/apis/apps/v1/namespaces/serving/deployments/gateway/scale")
    assert allowing_rule(rules, scale) == 1
    assert (
        allowing_rule(rules, request_info("PUT", "/apis/apps/v1/namespaces/serving/deployments/gateway"))
        is None
    )
    proxy = request_info("GET", f"{NS}/pods/p1:8000/proxy/metrics")
    assert allowing_rule([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}], proxy) is None
    assert unused(rules, [request_info("GET", f"{NS}/configmaps/a"), scale]) == {
        ("", "configmaps", "create", "a"),
        ("", "configmaps", "list", "a"),
    }


def _binding(subject: dict[str, str], ref_kind: str = "Role") -> dict[str, Any]:
    return {
        "kind": "RoleBinding",
        "metadata": {"name": "b", "namespace": "serving"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref_kind, "name": "r"},
        "subjects": [subject],
    }


def test_a_binding_gives_its_roles_rules_to_the_service_account_it_names_only() -> None:
    role = {"kind": "Role", "metadata": {"name": "r", "namespace": "serving"}, "rules": [{"verbs": ["get"]}]}
    user = "system:serviceaccount:serving:guard"
    for subject in (
        {"kind": "ServiceAccount", "name": "guard", "namespace": "serving"},
        {"kind": "ServiceAccount", "name": "guard"},
    ):
        assert bound_rules([role, _binding(subject)], user, "serving") == role["rules"], subject
    for subject in (
        {"kind": "ServiceAccount", "name": "guard", "namespace": "default"},
        {"kind": "ServiceAccount", "name": "other", "namespace": "serving"},
        {"kind": "serviceaccount", "name": "guard", "namespace": "serving"},
        {"kind": "User", "name": "guard"},
    ):
        assert bound_rules([role, _binding(subject)], user, "serving") == [], subject
    named = {"kind": "ServiceAccount", "name": "guard"}
    assert bound_rules([role, _binding(named, "role")], user, "serving") == []
    assert bound_rules([role, _binding(named)], user, "default") == []


@pytest.mark.parametrize(
    ("target", "verb"),
    [(f"{NS}/pods?watch=", "watch"), (f"{NS}/pods?watch=0", "list"), (f"{NS}/pods?labelSelector=", "list")],
)
def test_a_blank_query_value_is_kept_as_the_api_server_keeps_it(target: str, verb: str) -> None:
    """`?watch=` is a watch: requestinfo.go makes a GET without a name a list only where `watch` is absent,
    "false" or "0"; a query parser that drops blank values would judge it a list."""
    assert request_info_of("GET", target) == RequestInfo(verb, "", "serving", "pods")


def test_a_rule_of_another_api_group_allows_nothing() -> None:
    """The same resource and verb in another group (`deployments` of `apps` beside a core-group request,
    `leases` of coordination.k8s.io beside `leases` of another group) is not allowed: rbac.go's RuleAllows
    matches the API group too."""
    rules = [{"apiGroups": ["apps"], "resources": ["deployments", "leases"], "verbs": ["get"]}]
    assert allowing_rule(rules, RequestInfo("get", "apps", "serving", "deployments", "", "g")) == 0
    assert allowing_rule(rules, RequestInfo("get", "", "serving", "deployments", "", "g")) is None
    lease = RequestInfo("get", "coordination.k8s.io", "serving", "leases", "", "l")
    assert allowing_rule(rules, lease) is None
