"""A team member may create what the docs tell them to submit (issue 51, item 2): the team's RoleBindings
resolved against the ClusterRoles the pinned charts and Kubernetes ship, aggregation labels included
(tests/data/upstream/rbac/, with its sources)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.k8s.tenancy import team_group, team_objects
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts
from tests.upstream import UPSTREAM

CLUSTER_ROLES: list[dict[str, Any]] = yaml.safe_load((UPSTREAM / "rbac" / "cluster-roles.yaml").read_text())


def _rules(name: str) -> list[dict[str, Any]]:
    """A ClusterRole's rules, with those of every role its aggregationRule selects (the controller's
    union; one level, as aggregated roles that aggregate are not selected by the shipped ones)."""
    role = next((r for r in CLUSTER_ROLES if r["metadata"]["name"] == name), None)
    if role is None:
        return []
    rules = list(role.get("rules", []))
    for selector in role.get("aggregationRule", {}).get("clusterRoleSelectors", []):
        wanted = selector["matchLabels"].items()
        for other in CLUSTER_ROLES:
            if wanted <= other["metadata"].get("labels", {}).items():
                rules += other.get("rules", [])
    return rules


def allowed(
    objects: list[dict[str, Any]],
    namespace: str,
    subject: tuple[str, str],
    verb: str,
    group: str,
    resource: str,
) -> bool:
    kind, name = subject
    for binding in objects:
        if binding["kind"] != "RoleBinding" or binding["metadata"]["namespace"] != namespace:
            continue
        if not any(s["kind"] == kind and s["name"] == name for s in binding["subjects"]):
            continue
        for rule in _rules(binding["roleRef"]["name"]):
            if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
                return True
    return False


@pytest.fixture(scope="module")
def aws_k8s() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


@pytest.mark.parametrize(
    ("group", "resource"), [("jobset.x-k8s.io", "jobsets"), ("batch", "jobs"), ("", "pods")]
)
def test_every_team_member_may_create_jobsets_jobs_and_pods_in_the_team_namespace(
    aws_k8s: ResolvedPlatform, group: str, resource: str
) -> None:
    objects = team_objects(aws_k8s, fsx_facts())
    for team in aws_k8s.spec.scheduler.teams:
        namespace = f"team-{team.name}"
        for subject in [("User", u) for u in team.users] + [("Group", team_group(team.name))]:
            assert allowed(objects, namespace, subject, "create", group, resource), (subject, namespace)


def test_no_member_may_create_jobsets_in_another_team_namespace(aws_k8s: ResolvedPlatform) -> None:
    objects = team_objects(aws_k8s, fsx_facts())
    assert not allowed(objects, "team-product", ("User", "alice"), "create", "jobset.x-k8s.io", "jobsets")


def test_the_jobset_charts_own_editor_role_aggregates_nowhere() -> None:
    """Why Kueue's batch-user role is bound: `edit` gets only JobSet's viewer rules."""
    verbs = {v for r in _rules("edit") if "jobsets" in r["resources"] for v in r["verbs"]}
    assert "create" not in verbs and "get" in verbs
