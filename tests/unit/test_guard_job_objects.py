"""The guard Job's objects (infra/serving/guard_job_objects.py) held to what they cause, not to their text:
the Job's pod failure policy and backoffLimit run over its pods' ends by the Job controller's rules
(tests/k8s_job_failures.py), its NetworkPolicy over who reaches which port beside the serving namespace's
own policies (tests/k8s_network_policy.py). Its Role is held to the runner's real requests in
tests/unit/test_guard_job.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from infra.errors import ExitCode
from infra.k8s.objects import LABEL_COMPONENT, MONITORING_NAMESPACE, NAMESPACE_NAME_LABEL
from infra.k8s.release_lock import lease_name
from infra.k8s.serving import serving_objects
from infra.k8s.serving_versions import ServingRelease
from infra.platform.resolve import load_platform
from infra.serving.guard_job import SUPERSEDED_EXIT
from infra.serving.guard_job_objects import BACKOFF_LIMIT, guard_name, guard_objects
from infra.serving.guard_job_plan import job_plan
from tests.conftest import fsx_facts
from tests.k8s_job_failures import PodEnd, run_job
from tests.k8s_network_policy import Pod, admits
from tests.unit.test_serve_guard_on_kubernetes import stepped_stack
from tests.unit.test_serve_on_kubernetes import NS, V1, V2

RELEASE = ServingRelease(V1, canary=V2, canary_percent=20)
NAME = guard_name("embedder", "abc123")
SIGTERM_EXIT = 143
"""a pod evicted or preempted: its container ended by SIGTERM (128 + 15)"""


@pytest.fixture
def rendered(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The guard's objects for V2 in canary at 20 % on the stepped stack, and the serving namespace's."""
    platform = load_platform(stepped_stack(tmp_path))
    serving = serving_objects(platform, fsx_facts(), RELEASE)
    plan = job_plan(platform, fsx_facts(), RELEASE, "s3://aws-k8s-models-1a2b/embedder", f"job/{NAME}")
    stable = next(o for o in serving if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-v1"))
    return guard_objects(plan, NAME, stable["spec"]["template"]["spec"]), serving


def _job_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [o for o in objects if o["kind"] == "Job"]
    return dict(job["spec"])


def _ended(spec: dict[str, Any], code: int, disrupted: bool = False) -> PodEnd:
    """The guard's pod ended with `code` (in its one container, by the name the template gives it)."""
    (container,) = spec["template"]["spec"]["containers"]
    return PodEnd({container["name"]: code}, {"DisruptionTarget": "True"} if disrupted else {})


def test_pods_evicted_more_often_than_the_backoff_limit_never_fail_the_release(rendered: Any) -> None:
    """Nodes drained, pods preempted: each replacement resumes from the record, and however many there
    are the Job is not failed by them; the next pod that runs to its end completes it."""
    spec = _job_spec(rendered[0])
    ends = [_ended(spec, SIGTERM_EXIT, disrupted=True)] * (BACKOFF_LIMIT + 3) + [_ended(spec, 0)]
    ended = run_job(spec, ends)
    assert (ended.phase, ended.counted, ended.pods) == ("Complete", 0, BACKOFF_LIMIT + 4), ended
    # The same ends without the condition (a crash, not a disruption) fail it at the limit.
    crashed = run_job(spec, [_ended(spec, SIGTERM_EXIT)] * (BACKOFF_LIMIT + 3) + [_ended(spec, 0)])
    assert crashed.phase == "Failed" and crashed.reason == "BackoffLimitExceeded", crashed


@pytest.mark.parametrize("code", [SUPERSEDED_EXIT, int(ExitCode.BAD_INPUT)])
def test_a_superseded_guard_or_an_unreadable_plan_fails_the_job_at_its_first_pod(
    rendered: Any, code: int
) -> None:
    """Exit 10 (another command holds the release) and exit 2 (no plan, no cluster): no second pod, which
    would only meet the same Lease or the same plan; even when the pod was also being evicted."""
    spec = _job_spec(rendered[0])
    for disrupted in (False, True):
        ended = run_job(spec, [_ended(spec, code, disrupted), _ended(spec, 0)])
        assert (ended.phase, ended.reason, ended.pods) == ("Failed", "PodFailurePolicy", 1), ended


@pytest.mark.parametrize("code", [int(ExitCode.FAILED), int(ExitCode.NO_VERDICT), 1, 137])
def test_a_crashing_guard_is_retried_up_to_its_backoff_limit(rendered: Any, code: int) -> None:
    """An API refusal (4), looks that failed (5), an uncaught error (1), the memory limit (137): counted,
    each retry a new pod that resumes; the limit's worth of crashes still ends the release, one more fails
    the Job."""
    spec = _job_spec(rendered[0])
    resumed = run_job(spec, [_ended(spec, code)] * BACKOFF_LIMIT + [_ended(spec, 0)])
    assert (resumed.phase, resumed.counted) == ("Complete", BACKOFF_LIMIT), resumed
    failed = run_job(spec, [_ended(spec, code)] * (BACKOFF_LIMIT + 1) + [_ended(spec, 0)])
    assert (failed.phase, failed.reason, failed.pods) == ("Failed", "BackoffLimitExceeded", BACKOFF_LIMIT + 1)


def test_the_pod_failure_policy_needs_pods_that_are_never_restarted_in_place(rendered: Any) -> None:
    spec = _job_spec(rendered[0])
    assert run_job(spec, [_ended(spec, 0)]).phase == "Complete"
    on_failure = {**spec, "template": {"spec": {**spec["template"]["spec"], "restartPolicy": "OnFailure"}}}
    with pytest.raises(ValueError, match="restartPolicy Never"):
        run_job(on_failure, [_ended(spec, 0)])


def _template_pod(workload: dict[str, Any]) -> Pod:
    return Pod(NS, workload["spec"]["template"]["metadata"]["labels"], {NAMESPACE_NAME_LABEL: NS})


def test_the_guards_pod_alone_reaches_the_gateways_metrics_and_the_model_servers(rendered: Any) -> None:
    """The serving namespace's own policies keep the guard out of both ports; the Job's policy lets its pod
    (the Job template's labels) in, at those two ports only, and no other pod: not another release's
    guard, not a pod of the namespace without the guard's labels. The gateways and monitoring keep their
    way in."""
    objects, serving = rendered
    plan_ports = {"gateway": 8404, "model-server": 8000}
    ours = [o for o in objects if o["kind"] == "NetworkPolicy"]
    theirs = [o for o in serving if o["kind"] == "NetworkPolicy"]
    workloads = [o for o in serving if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    targets = {
        component: _template_pod(
            next(w for w in workloads if _template_pod(w).labels.get(LABEL_COMPONENT) == component)
        )
        for component in plan_ports
    }
    guard = _template_pod({"spec": _job_spec(objects)})
    other_guard = Pod(NS, {**guard.labels, "gpuplat/serve-guard": guard_name("embedder", "old999")})
    stranger = Pod(NS, {LABEL_COMPONENT: "batch"})
    monitoring = Pod(MONITORING_NAMESPACE, {}, {NAMESPACE_NAME_LABEL: MONITORING_NAMESPACE})
    for component, port in plan_ports.items():
        target = targets[component]
        assert not admits(theirs, guard, target, port), component
        assert admits(theirs + ours, guard, target, port), component
        assert not admits(theirs + ours, guard, target, port, "UDP"), component
        for source in (other_guard, stranger):
            assert not admits(theirs + ours, source, target, port), (component, source)
        assert admits(theirs + ours, monitoring, target, port) == admits(theirs, monitoring, target, port)
    assert admits(theirs + ours, targets["gateway"], targets["model-server"], 8000)
    # No other port of theirs opened to the guard.
    assert not admits(theirs + ours, guard, targets["model-server"], 9090)


@pytest.mark.parametrize("model", ["embedder", "e" * 80, "a" * 35 + "-" + "b" * 30, "m" * 36 + "-x" * 20])
def test_a_jobs_name_is_a_label_value_naming_the_model_and_the_release(model: str) -> None:
    """The Job's name is the value of its pods' `batch.kubernetes.io/job-name` label: a DNS label of 63
    characters at most, the model's part of its Lease's name (shortened with a hash where long), then the
    release's ID."""
    name = guard_name(model, "abc123")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
    assert name == f"gpuplat-serve-guard-{lease_name(model).removeprefix('gpuplat-release-')}-abc123", name


def test_the_guards_pod_goes_where_the_stable_versions_pods_may_go(tmp_path: Path) -> None:
    """Its image is the stable version's, already pulled on those nodes: the pod gets their node selector,
    tolerations and affinity, whichever the stable version's pods have."""
    platform = load_platform(stepped_stack(tmp_path))
    plan = job_plan(platform, fsx_facts(), RELEASE, "s3://aws-k8s-models-1a2b/embedder", f"job/{NAME}")
    stable = next(
        o for o in serving_objects(platform, fsx_facts(), RELEASE) if o["metadata"]["name"].endswith("-v1")
    )
    spread = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}
    placed = {
        **stable["spec"]["template"]["spec"],
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}},
    }
    pod = _job_spec(guard_objects(plan, NAME, placed))["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity"):
        assert placed[key] and pod[key] == placed[key], key
    assert pod["containers"][0]["image"] == placed["containers"][0]["image"]
    bare = _job_spec(guard_objects(plan, NAME, {"containers": placed["containers"]}))["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "affinity"} & set(bare)


def test_the_pods_command_finds_its_code_and_plan_in_the_config_maps_it_mounts(rendered: Any) -> None:
    """Each file the container's command names lies under one of its mounts, whose volume is a ConfigMap
    rendered with the Job, holding that file's name as a key: the zip application and the plan."""
    objects = rendered[0]
    pod = _job_spec(objects)["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    found: dict[str, str] = {}
    for argument in container["command"][1:]:
        for mount in container["volumeMounts"]:
            folder = mount["mountPath"].rstrip("/") + "/"
            if argument.startswith(folder):
                config_map = maps[volumes[mount["name"]]["configMap"]["name"]]
                key = argument.removeprefix(folder)
                assert key in {**config_map.get("data", {}), **config_map.get("binaryData", {})}, argument
                found[key] = config_map["metadata"]["name"]
    assert found == {"guard.pyz": f"{NAME}-code", "plan.json": f"{NAME}-plan"}, found
