"""What the API server's RBAC authorizer decides for one request, for the tests that hold a Role to what a
client really calls (the guard Job's runner: tests/unit/test_guard_job.py).

Read at the source (kubernetes/kubernetes, the stored snapshots named):
- a request's attributes from its method and path: staging/src/k8s.io/apiserver/pkg/endpoints/request/
  requestinfo.go (snapshot 01bb682e), RequestInfoFactory.NewRequestInfo: `/api/v1/...` has the group "",
  `/apis/GROUP/VERSION/...` that group; `namespaces/NS/` is dropped before the resource; the parts after it
  are resource, name, subresource (`pods/NAME/proxy`); a leading `proxy` or `watch` part is the verb
  (`proxy` then takes no subresource); else POST is create, GET get, PUT update, PATCH patch, DELETE
  delete; a GET without a name is list (watch where the query's `watch` is not false or 0), a DELETE
  without a name deletecollection;
- whether a rule allows it: plugin/pkg/auth/authorizer/rbac/rbac.go (snapshot 01aa0f3f), RuleAllows: verb,
  API group, resource (with its subresource joined, `pods/proxy`) and name all match; the matchers in
  pkg/apis/rbac/v1/evaluation_helpers.go (snapshot 03bf11a3): `*` matches any verb, group or resource,
  `*/SUB` any resource's subresource SUB, and a rule with resourceNames matches only a request naming one
  of them, so never a list, a create or a deletecollection, which carry no name (pkg/apis/rbac/helpers.go
  refuses such rules when built: "verbs ... do not have names available");
- a Role's rules are visited in turn and the first that allows decides; none: no opinion, a 403;
- whose rules apply: pkg/registry/rbac/validation/rule.go (DefaultRuleResolver, VisitRulesFor,
  appliesToUser, GetRoleReferenceRules): each RoleBinding of the request's namespace with a subject that
  is the user (kind `User` by name, `ServiceAccount` as `system:serviceaccount:NS:NAME`, NS the binding's
  own where the subject names none; any other kind applies to no one) gives the rules of its roleRef, a
  `Role` of the binding's namespace by name (a kind other than Role or ClusterRole: an error, no rules).

Not modelled: non-resource URLs (a Role cannot grant them), Groups, ClusterRoles and aggregation, a list
narrowed to one name by `fieldSelector=metadata.name=` (the guard sends none), impersonation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Rule = Mapping[str, Any]


@dataclass(frozen=True)
class RequestInfo:
    verb: str
    api_group: str
    namespace: str
    resource: str
    subresource: str = ""
    name: str = ""

    def __str__(self) -> str:
        resource = self.resource + (f"/{self.subresource}" if self.subresource else "")
        group = f".{self.api_group}" if self.api_group else ""
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {resource}{group}{named} in {self.namespace or 'the cluster'}"


_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def request_info(method: str, path: str, query: Mapping[str, str] | None = None) -> RequestInfo:
    """The attributes RBAC judges, of a resource request (a ValueError for any other path)."""
    parts = [part for part in path.strip("/").split("/") if part]
    if len(parts) < 3 or parts[0] not in ("api", "apis") or (parts[0] == "apis" and len(parts) < 4):
        raise ValueError(f"{path} is no resource request")
    group = parts[1] if parts[0] == "apis" else ""
    parts = parts[3:] if parts[0] == "apis" else parts[2:]
    verb = _VERBS.get(method.upper(), "")
    if parts and parts[0] in _SPECIAL_VERBS:
        verb, parts = parts[0], parts[1:]
    namespace = ""
    if parts and parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    name = parts[1] if len(parts) >= 2 else ""
    resource = parts[0] if parts else ""
    if not name and verb == "get":
        watch = (query or {}).get("watch")
        verb = "list" if watch is None or watch.lower() in ("false", "0") else "watch"
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb, group, namespace, resource, subresource, name)


def request_info_of(method: str, target: str) -> RequestInfo:
    """request_info of a request line's target, its query read as the API server reads it: a blank value
    kept (`?watch=` asks a watch: requestinfo.go reads `watch` as false only for "false" or "0")."""
    parts = urlsplit(target)
    return request_info(method, parts.path, dict(parse_qsl(parts.query, keep_blank_values=True)))


def _matches(wanted: Sequence[str], value: str) -> bool:
    return "*" in wanted or value in wanted


def rule_allows(rule: Rule, info: RequestInfo) -> bool:
    combined = info.resource + (f"/{info.subresource}" if info.subresource else "")
    resources = rule.get("resources") or []
    resource_matches = _matches(resources, combined) or (
        bool(info.subresource) and f"*/{info.subresource}" in resources
    )
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("verbs") or [], info.verb)
        and _matches(rule.get("apiGroups") or [], info.api_group)
        and resource_matches
        and (not names or info.name in names)
    )


def allowing_rule(rules: Sequence[Rule], info: RequestInfo) -> int | None:
    """The index of the first rule that allows the request; None: RBAC has no opinion (a 403)."""
    return next((index for index, rule in enumerate(rules) if rule_allows(rule, info)), None)


Grant = tuple[str, str, str, str]
"""(API group, resource, verb, name): one thing a rule allows; the name "" where the rule names none."""


def grants(rules: Sequence[Rule]) -> set[Grant]:
    """Each rule taken apart into its grants, to be matched with the requests that used them."""
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
        for name in rule.get("resourceNames") or [""]
    }


def unused(rules: Sequence[Rule], requests: Sequence[RequestInfo]) -> set[Grant]:
    """The grants of `rules` no request needed: each grant a rule of its own, allowing none of them."""
    return {
        grant for grant in grants(rules) if not any(rule_allows(_rule_of(grant), info) for info in requests)
    }


def _rule_of(grant: Grant) -> dict[str, list[str]]:
    group, resource, verb, name = grant
    return {
        "apiGroups": [group],
        "resources": [resource],
        "verbs": [verb],
        "resourceNames": [name] if name else [],
    }


def forbidden_message(info: RequestInfo, user: str) -> str:
    """The API server's words for a request no rule allows, in the shape of apiserver's
    pkg/endpoints/handlers/responsewriters/errors.go forbiddenMessage (snapshot 01688530)."""
    resource = info.resource + (f".{info.api_group}" if info.api_group else "")
    resource += f"/{info.subresource}" if info.subresource else ""
    scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
    return f'User "{user}" groups [] cannot {info.verb} {resource} {scope}.'


def _applies(subject: Mapping[str, Any], user: str, namespace: str) -> bool:
    if subject.get("kind") == "User":
        return bool(subject.get("name") == user)
    if subject.get("kind") == "ServiceAccount":
        return user == f"system:serviceaccount:{subject.get('namespace') or namespace}:{subject.get('name')}"
    return False


def bound_rules(objects: Sequence[Mapping[str, Any]], user: str, namespace: str) -> list[Rule]:
    """The rules `objects` (Roles, RoleBindings among others) give `user` in `namespace`."""
    roles = {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] == "Role" and o["metadata"]["namespace"] == namespace
    }
    rules: list[Rule] = []
    for binding in objects:
        if binding["kind"] != "RoleBinding" or binding["metadata"]["namespace"] != namespace:
            continue
        if not any(_applies(s, user, namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        if ref.get("kind") == "Role" and ref.get("name") in roles:
            rules.extend(roles[ref["name"]].get("rules") or [])
    return rules
