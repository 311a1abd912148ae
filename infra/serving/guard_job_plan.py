"""The guard Job's plan (infra/serving/guard_job.py JobPlan), rendered by the CLI from the stack and the
release as it stands: what the Job, which carries neither the spec's models nor the templates, needs to
carry the canary through its steps. Each share it may set (each step below 100 %, the share that loads
the canary's servers as the stable's, carry.with_equal_load_step, and 0 for a rollback) comes with the
objects that set it: those of the release at that share (infra/k8s/serving.py serving_objects) that differ
from the release's objects now (the gateways' ConfigMap and Deployment: the Deployment's config-sha256
annotation rolls its pods), and the release record at that share.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from infra.k8s.facts import ClusterFacts
from infra.k8s.objects import serving_namespace
from infra.k8s.serving import GATEWAY, serving_objects
from infra.k8s.serving_apply import record_manifest
from infra.k8s.serving_versions import ServingRelease
from infra.platform.resolve import ResolvedPlatform
from infra.serving.analysis import RulesRead
from infra.serving.carry import added_interval_s, equal_load_share, releases_steps
from infra.serving.engine_metrics import itl_histograms, latency_histogram
from infra.serving.guard_job import JobPlan, JobRules, StepRead
from infra.serving.pod_readings import NAMES
from infra.spec.models import Canary

APPLIED_BY_A_SHARE = frozenset({"ConfigMap", "Deployment"})
"""the kinds a share changes (the gateways'): the Job's Role may patch only those, by name"""


def job_plan(
    platform: ResolvedPlatform,
    facts: ClusterFacts,
    current: ServingRelease,
    model_uri: str | None,
    holder: str,
    *,
    past_gate: bool = False,
    duration_s: float | None = None,
    rollout_s: float = 1800.0,
    servers: tuple[int, int] = (0, 0),
) -> JobPlan:
    """`servers`: the canary's servers and the stable's up (carry.Carried.servers_up), which the equal-load
    share is worked out from."""
    serving = platform.spec.serving
    if serving is None or current.canary is None:
        raise ValueError("a guard Job carries a canary: the release has none")
    rules: Canary = serving.canary or Canary()
    # The step at 100 % is the promotion, which stays the operator's (as on the nodes): the Job ends before.
    steps = tuple(StepRead(s.percent, s.manual_gate) for s in rules.steps if s.percent < 100)
    namespace = serving_namespace(platform)
    now = _by_name(serving_objects(platform, facts, current))
    shares: dict[int, list[dict[str, Any]]] = {}
    equal = equal_load_share(servers)
    added = () if equal is None else (equal,)
    for percent in sorted({0, current.canary_percent, *added, *(step.percent for step in steps)}):
        at = replace(current, canary_percent=percent)
        changed = [
            manifest
            for key, manifest in _by_name(serving_objects(platform, facts, at)).items()
            if now.get(key) != manifest
        ]
        unexpected = sorted({m["kind"] for m in changed} - APPLIED_BY_A_SHARE)
        if unexpected:
            raise ValueError(f"a share of {percent} % changes objects the guard Job may not: {unexpected}")
        shares[percent] = [*changed, record_manifest(namespace, at, model_uri)]
    job_rules = JobRules(**RulesRead.of(rules).to_json(), steps=steps)
    share = current.canary_percent
    ahead = releases_steps(steps, share, share, past_gate, equal)
    return JobPlan(
        model=current.stable.reference.partition("@")[0],
        namespace=namespace,
        holder=holder,
        canary=current.canary.reference,
        stable_slug=current.stable.slug,
        canary_slug=current.canary.slug,
        rules=job_rules,
        names=NAMES,
        latency=latency_histogram(serving.engine),
        itl=itl_histograms(serving.engine),
        shares=shares,
        gateway=GATEWAY,
        past_gate=past_gate,
        duration_s=duration_s,
        rollout_s=rollout_s,
        servers=servers,
        back_to=share,
        added_interval_s=added_interval_s(job_rules, ahead, share, servers),
    )


def _by_name(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}
