"""The Kubernetes rules (k8s-isolation, k8s-spot-flavors, k8s-quotas) on the Kueue stacks run through the
real program under the mocks: the shipped stacks pass, and each broken variant (a changed stack, or the
real program with one object changed by a stack transformation) is refused with the rule and the
object named."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.check import verdicts_for
from infra.policy.rules import Verdict
from infra.spec.load import CONFIG_KEY
from tests.conftest import stack_document
from tests.pulumi.findings import as_written, expected_findings
from tests.pulumi.test_policy_rules import KUBERNETES_RULES, Mutate, Program, _set, _transform

KUEUE = "kubernetes:kueue.x-k8s.io/v1beta2"
K8S_RULES = tuple(sorted(KUBERNETES_RULES))


def _flavor_selects_inference(props: dict[str, Any]) -> None:
    if props["metadata"]["name"] == "train":
        props["spec"]["nodeLabels"] = {"gpuplat/pool": "infer"}


def _research_takes_more(props: dict[str, Any]) -> None:
    if props["metadata"]["name"] == "research":
        props["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 64


def _research_reaches_its_cap_on_spot_too(props: dict[str, Any]) -> None:
    """Each flavor within the cap (48), their sum not, and no quota-only group to hold the sum: Kueue
    would admit up to 32 + 32 GPUs."""
    if props["metadata"]["name"] == "research":
        del props["spec"]["resourceGroups"][1:]


def _spot_first(props: dict[str, Any]) -> None:
    props["spec"]["resourceGroups"][0]["flavors"].reverse()


def _no_borrowing_limit(props: dict[str, Any]) -> None:
    if props["metadata"]["name"] == "eval":
        del props["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"]


def _audit_only(props: dict[str, Any]) -> None:
    props["spec"]["validationActions"] = ["Audit"]


def _local_queue_elsewhere(props: dict[str, Any]) -> None:
    if props["metadata"]["namespace"] == "team-eval":
        props["spec"]["clusterQueue"] = "nobody"


def _train_pool_with_inference_taint(spec: dict[str, Any]) -> None:
    pool = next(p for p in spec["pools"] if p["name"] == "train")
    pool["taints"] = [{"key": "gpuplat/inference", "value": "true", "effect": "NoSchedule"}]


def _pod_of(name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(props: dict[str, Any]) -> None:
        if props["metadata"]["name"] == name:
            change(props["spec"]["template"]["spec"])

    return apply


def _research_on_h200(props: dict[str, Any]) -> None:
    if props["metadata"]["name"] == "research":
        props["spec"]["resourceGroups"][0]["flavors"][0]["name"] = "h200"


def _gateway_in_a_team_namespace(props: dict[str, Any]) -> None:
    """The gateway's Deployment as a team's workload that asks for the inference nodes both ways."""
    if props["metadata"]["name"] == "gateway":
        props["metadata"]["namespace"] = "team-research"
        pod = props["spec"]["template"]["spec"]
        pod["nodeSelector"] = {"gpuplat/role": "infer"}
        pod["tolerations"] = [{"operator": "Exists"}]


def _flavor_by_role_tolerating_inference(props: dict[str, Any]) -> None:
    if props["metadata"]["name"] == "train":
        props["spec"]["nodeLabels"]["gpuplat/role"] = "infer"  # its pool's label kept
    if props["metadata"]["name"] == "train-spot":
        props["spec"]["tolerations"] = [{"key": "gpuplat/inference", "operator": "Exists"}]


DEPLOYMENT = "kubernetes:apps/v1:Deployment"

VARIANTS: dict[str, tuple[str, Mutate | None, Program | None]] = {
    "aws-k8s": ("aws-k8s", None, None),
    "onprem-k8s": ("onprem-k8s", None, None),
    "flavor-on-inference": (
        "aws-k8s",
        None,
        _transform(f"{KUEUE}:ResourceFlavor", _flavor_selects_inference),
    ),
    "overcommitted-flavor": ("aws-k8s", None, _transform(f"{KUEUE}:ClusterQueue", _research_takes_more)),
    "reach-past-cap-over-flavors": (
        "aws-k8s",
        None,
        _transform(f"{KUEUE}:ClusterQueue", _research_reaches_its_cap_on_spot_too),
    ),
    "spot-first": ("aws-k8s", None, _transform(f"{KUEUE}:ClusterQueue", _spot_first)),
    "unbounded-borrowing": ("aws-k8s", None, _transform(f"{KUEUE}:ClusterQueue", _no_borrowing_limit)),
    "admission-audit-only": (
        "aws-k8s",
        None,
        _transform(
            "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding", _audit_only
        ),
    ),
    "dangling-local-queue": ("aws-k8s", None, _transform(f"{KUEUE}:LocalQueue", _local_queue_elsewhere)),
    "train-tolerates-inference": ("aws-k8s", _train_pool_with_inference_taint, None),
    "team-quota-above-gpus": (
        "onprem-k8s",
        _set("scheduler.teams", [{"name": "research", "gpu_quota": 40, "fairshare": 1}]),
        None,
    ),
    "spot-not-interruptible": ("aws-k8s", _set("pool:train-spot.interruptible", False), None),
    "untainted-gpu-pool": ("aws-k8s", _set("pool:train.taints", []), None),
    "model-server-on-training": (
        "aws-k8s",
        None,
        _transform(
            DEPLOYMENT,
            _pod_of("model-server", lambda pod: pod.update(nodeSelector={"gpuplat/pool": "train"})),
        ),
    ),
    "model-server-anywhere": (
        "aws-k8s",
        None,
        _transform(DEPLOYMENT, _pod_of("model-server", lambda pod: pod.pop("nodeSelector"))),
    ),
    "model-server-tolerates-spot": (
        "aws-k8s",
        None,
        _transform(
            DEPLOYMENT,
            _pod_of(
                "model-server",
                lambda pod: pod["tolerations"].append({"key": "gpuplat/spot", "operator": "Exists"}),
            ),
        ),
    ),
    "queue-names-unknown-flavor": ("aws-k8s", None, _transform(f"{KUEUE}:ClusterQueue", _research_on_h200)),
    "team-quota-at-gpus": (
        "onprem-k8s",
        _set("scheduler.teams", [{"name": "research", "gpu_quota": 32, "fairshare": 1}]),
        None,
    ),
    "team-workload-on-inference": ("aws-k8s", None, _transform(DEPLOYMENT, _gateway_in_a_team_namespace)),
    "flavors-reach-inference": (
        "aws-k8s",
        None,
        _transform(f"{KUEUE}:ResourceFlavor", _flavor_by_role_tolerating_inference),
    ),
}


# Recordings of the variants, kept for the process rather than the module's run: recording the program is
# most of these tests' time, and pytest run again in this process (mutmut's runs of them, one per mutant
# of the policy rules, forked from the run that recorded: scripts/mutation/run.py) reuses them.
_RECORDED: dict[str, tuple[ResolvedPlatform, Recording]] = {}


def _variant(name: str, tmp: str) -> tuple[ResolvedPlatform, Recording]:
    if name not in _RECORDED:
        _RECORDED[name] = _record_variant(name, tmp)
    return _RECORDED[name]


def _record_variant(name: str, tmp: str) -> tuple[ResolvedPlatform, Recording]:
    from pathlib import Path

    base, mutate, program = VARIANTS[name]
    document = copy.deepcopy(stack_document(base))
    if mutate is not None:
        mutate(document["config"][CONFIG_KEY])
    path = Path(tmp) / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    platform = load_platform(path)
    return platform, record(platform, program)


@pytest.fixture
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[Verdict]]:
    folder = str(tmp_path_factory.getbasetemp())

    def run(name: str) -> list[Verdict]:
        platform, recording = _variant(name, folder)
        return [v for v in verdicts_for(platform, recording) if v.rule in K8S_RULES]

    return run


@pytest.mark.parametrize("stack", ["aws-k8s", "onprem-k8s"])
def test_shipped_kueue_stacks_pass(verdicts: Callable[[str], list[Verdict]], stack: str) -> None:
    assert verdicts(stack) == []


REFUSALS = [
    ("flavor-on-inference", "k8s-isolation", "ResourceFlavor train"),
    ("overcommitted-flavor", "k8s-quotas", "ResourceFlavor train"),
    ("reach-past-cap-over-flavors", "k8s-quotas", "ClusterQueue research"),
    ("spot-first", "k8s-spot-flavors", "ClusterQueue research"),
    ("unbounded-borrowing", "k8s-quotas", "ClusterQueue eval"),
    ("admission-audit-only", "k8s-isolation", "stack aws-k8s"),
    ("dangling-local-queue", "k8s-quotas", "LocalQueue team-eval/default"),
    ("train-tolerates-inference", "k8s-isolation", "ResourceFlavor train"),
    ("team-quota-above-gpus", "k8s-quotas", "ResourceQuota team-research/gpus"),
    ("spot-not-interruptible", "k8s-spot-flavors", "ResourceFlavor train-spot"),
    ("untainted-gpu-pool", "k8s-isolation", "pool train"),
    ("queue-names-unknown-flavor", "k8s-quotas", "ClusterQueue research"),
    ("model-server-on-training", "k8s-isolation", "Deployment serving/model-server"),
    ("model-server-anywhere", "k8s-isolation", "Deployment serving/model-server"),
    ("model-server-tolerates-spot", "k8s-isolation", "Deployment serving/model-server"),
    ("team-workload-on-inference", "k8s-isolation", "Deployment team-research/gateway"),
    ("flavors-reach-inference", "k8s-isolation", "ResourceFlavor train"),
    ("flavors-reach-inference", "k8s-isolation", "ResourceFlavor train-spot"),
]


def test_every_kubernetes_rule_has_a_refusal() -> None:
    assert {rule for _, rule, _ in REFUSALS} == KUBERNETES_RULES


@pytest.mark.parametrize(("variant", "rule", "resource"), REFUSALS)
def test_broken_variant_is_refused_with_the_rule_and_object(
    verdicts: Callable[[str], list[Verdict]], variant: str, rule: str, resource: str
) -> None:
    found = verdicts(variant)
    assert any(v.rule == rule and v.resource == resource for v in found), found
    assert all(v.severity == "mandatory" for v in found)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_is_told_what_it_was_told(
    variant: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each variant's findings, of every rule, word for word (tests/data/policy_findings.yaml)."""
    platform, recording = _variant(variant, str(tmp_path_factory.getbasetemp()))
    assert as_written(verdicts_for(platform, recording)) == expected_findings("kubernetes", variant)
