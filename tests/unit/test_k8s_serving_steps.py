"""The steps of a release on the Kueue platform, played against the objects they apply: no request is
drawn for a workload before it is ready, a promotion never sends every request to fewer replicas than the
stable version had, and a workload is deleted only after every gateway runs a configuration that draws
no request for it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from infra.k8s.serving import serving_objects, version_track_names
from infra.k8s.serving_steps import (
    ReleaseRefused,
    ReleaseStep,
    deploy_canary,
    finish_promotion,
    promote,
    rollback,
    take_over,
)
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts

V1 = ServedVersion("embedder@1", "s3://models/embedder/1")
V2 = ServedVersion("embedder@2", "s3://models/embedder/2")
STABLE_REPLICAS = 4


@pytest.fixture(scope="module")
def aws() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


def shares(platform: ResolvedPlatform, release: ServingRelease | None) -> dict[str, int]:
    """Workload -> the share of the requests the gateways' configuration sends it (read from haproxy.cfg)."""
    [config] = [
        o["data"]["haproxy.cfg"]
        for o in serving_objects(platform, fsx_facts(), release)
        if o["kind"] == "ConfigMap"
    ]
    drawn = re.search(r"use_backend inference_canary if \{ rand\(100\) lt (\d+) \}", config)
    canary = int(drawn.group(1)) if drawn else 0
    found: dict[str, int] = {}
    for backend, service in re.findall(
        r"^backend (\S+)\n(?:.*\n)*?\s+server-template \S+ 1-\d+ ([a-z0-9-]+)\.serving\.svc",
        config,
        re.MULTILINE,
    ):
        found[service.removesuffix("-replicas")] = canary if backend == "inference_canary" else 100 - canary
    return found


def workloads(platform: ResolvedPlatform, release: ServingRelease | None) -> dict[str, int | None]:
    return {
        o["metadata"]["name"]: o["spec"].get("replicas")
        for o in serving_objects(platform, fsx_facts(), release)
        if o["kind"] == "Deployment" and o["metadata"]["name"] != "gateway"
    }


def play(
    platform: ResolvedPlatform, start: ServingRelease | None, steps: list[ReleaseStep]
) -> dict[str, int]:
    """Apply each step as the driver does and check what the cluster would hold; returns the ready replicas
    at the end. A workload is ready only once a step waited for it. `start` None: the stack's own model."""
    stable = "model-server" if start is None else version_track_names(start.stable)[0]
    ready = {stable: STABLE_REPLICAS}
    if start is not None and start.canary is not None:
        ready[version_track_names(start.canary)[0]] = start.canary_replicas
    drawn_by_running_gateways = {w for w, share in shares(platform, start).items() if share}
    for step in steps:
        served = shares(platform, step.release)
        for workload, share in served.items():
            assert share == 0 or ready.get(workload, 0) >= 1, f"{step.says}: {workload} drawn before ready"
            if share == 100:
                assert ready[workload] >= STABLE_REPLICAS, f"{step.says}: every request on {ready[workload]}"
        present = workloads(platform, step.release)
        for workload in step.removes:
            assert workload not in present and workload not in served, step.says
            assert workload not in drawn_by_running_gateways, f"{step.says}: a gateway still draws {workload}"
            ready.pop(workload, None)
        # Until the gateways rolled, pods of the previous configuration still run beside the new ones.
        drawing = {w for w, share in served.items() if share}
        drawn_by_running_gateways = drawing if step.gateways_rolled else drawn_by_running_gateways | drawing
        if step.ready is not None:
            workload, count = step.ready
            assert present[workload] == count, step.says
            ready[workload] = count
    return ready


def test_a_canary_is_ready_before_its_share_is_drawn(aws: ResolvedPlatform) -> None:
    steps = deploy_canary(ServingRelease(V1), V2, 20)
    assert [s.release.canary_percent for s in steps] == [0, 20]
    assert steps[0].ready == ("model-server-embedder-v2", 1)
    # The analysis that follows must see the share on every gateway, not on the new pods only.
    assert steps[-1].gateways_rolled
    play(aws, ServingRelease(V1), steps)


def test_the_same_deploy_again_after_a_kill_goes_on_where_it_stopped(aws: ResolvedPlatform) -> None:
    """Killed while the canary started (share 0): the same command again waits for it, then draws its share;
    a new share for the same canary likewise. Another version is still refused."""
    cut = deploy_canary(ServingRelease(V1), V2, 20)[0].release
    again = deploy_canary(cut, V2, 20)
    assert again[0].ready == ("model-server-embedder-v2", 1)
    assert play(aws, cut, again)["model-server-embedder-v2"] == 1
    assert again[-1].release == ServingRelease(V1, canary=V2, canary_percent=20)
    wider = deploy_canary(again[-1].release, V2, 50)
    assert wider[-1].release.canary_percent == 50 and wider[-1].gateways_rolled
    play(aws, again[-1].release, wider)
    with pytest.raises(ReleaseRefused, match="already in canary"):
        deploy_canary(cut, ServedVersion("embedder@2", "/elsewhere"), 20)


def test_promote_grows_the_canary_before_it_takes_every_request_then_removes_the_old(
    aws: ResolvedPlatform,
) -> None:
    current = ServingRelease(V1, canary=V2, canary_percent=20)
    steps = promote(current, STABLE_REPLICAS)
    ready = play(aws, current, steps)
    assert ready == {"model-server-embedder-v2": STABLE_REPLICAS}
    assert steps[-1].removes == ("model-server-embedder-v1", "model-server-embedder-v1-replicas")
    # The canary keeps its share while it grows; the old stable version keeps its replicas after the switch.
    assert steps[0].release.canary_percent == 20
    assert workloads(aws, steps[1].release)["model-server-embedder-v1"] == STABLE_REPLICAS
    final = steps[-1].release
    assert final.stable == V2 and final.canary is None and final.stable_replicas == STABLE_REPLICAS


def test_rollback_draws_nothing_for_the_canary_before_removing_it(aws: ResolvedPlatform) -> None:
    current = ServingRelease(V1, canary=V2, canary_percent=20)
    steps = rollback(current)
    assert steps[0].gateways_rolled and shares(aws, steps[0].release)["model-server-embedder-v2"] == 0
    assert play(aws, current, steps) == {"model-server-embedder-v1": STABLE_REPLICAS}
    assert steps[-1].release == ServingRelease(V1)


def test_a_promotion_cut_short_after_the_switch_is_finished(aws: ResolvedPlatform) -> None:
    cut = promote(ServingRelease(V1, canary=V2, canary_percent=20), STABLE_REPLICAS)[1].release
    [step] = finish_promotion(cut)
    assert step.removes == ("model-server-embedder-v1", "model-server-embedder-v1-replicas")
    assert "model-server-embedder-v1" not in workloads(aws, step.release)


def test_promote_again_after_a_cut_promotion_finishes_it_as_a_new_deploy_says() -> None:
    """A kill after the switch: `deploy` refuses, telling the user to run promote again; that must finish."""
    cut = promote(ServingRelease(V1, canary=V2, canary_percent=20), STABLE_REPLICAS)[1].release
    with pytest.raises(ReleaseRefused, match="serve promote` again"):
        deploy_canary(cut, ServedVersion("embedder@3", "/m/3"), 5)
    assert promote(cut, STABLE_REPLICAS) == finish_promotion(cut)
    taking_over = ServingRelease(V1, stable_replicas=STABLE_REPLICAS, stack_model="retiring")
    assert promote(taking_over, STABLE_REPLICAS) == finish_promotion(taking_over)


@pytest.mark.parametrize(("stable", "canary"), [(1, 1), (0, 1), (2, 5)])
def test_promote_never_shrinks_below_one_replica_or_below_the_canarys_own(
    aws: ResolvedPlatform, stable: int, canary: int
) -> None:
    """A stable version on one replica (or none left by KEDA), a canary already larger than the stable one:
    the promoted version runs at least one replica, and never fewer than the canary had."""
    current = ServingRelease(V1, canary=V2, canary_percent=20, canary_replicas=canary)
    steps = promote(current, stable)
    grown = max(stable, canary, 1)
    assert steps[0].ready == ("model-server-embedder-v2", grown)
    assert steps[1].release.retiring_replicas == max(stable, 1)
    assert steps[-1].release == ServingRelease(V2, stable_replicas=grown)
    assert workloads(aws, steps[1].release)["model-server-embedder-v1"] == max(stable, 1)


def test_a_take_over_from_a_stack_at_zero_replicas_starts_one(aws: ResolvedPlatform) -> None:
    serving = aws.spec.serving
    assert serving is not None
    steps = take_over(serving.model, ServedVersion("llama@1", serving.model), 0)
    assert steps[0].ready == ("model-server-llama-v1", 1)


def test_a_first_release_takes_over_from_the_stacks_own_model_servers(aws: ResolvedPlatform) -> None:
    serving = aws.spec.serving
    assert serving is not None
    own = ServedVersion("llama@1", serving.model)
    steps = take_over(serving.model, own, STABLE_REPLICAS)
    assert play(aws, None, steps) == {"model-server-llama-v1": STABLE_REPLICAS}
    assert steps[-1].removes == ("model-server", "model-server-replicas")
    targets = [
        next(o for o in serving_objects(aws, fsx_facts(), s.release) if o["kind"] == "ScaledObject")["spec"][
            "scaleTargetRef"
        ]["name"]
        for s in steps
    ]
    assert targets == ["model-server", "model-server-llama-v1", "model-server-llama-v1"]
    assert steps[-1].release == ServingRelease(own, stable_replicas=STABLE_REPLICAS)
    [finish] = finish_promotion(steps[1].release)
    assert finish.removes == ("model-server", "model-server-replicas")


def test_a_take_over_on_eks_reads_the_stacks_own_files_from_the_stacks_bucket(aws: ResolvedPlatform) -> None:
    """`s3://models/...` names the stack's bucket of purpose `models`, whose generated name the facts carry:
    the registered version of those files must read them there, as the stack's own servers do."""
    serving = aws.spec.serving
    assert serving is not None
    real = serving.model.replace("s3://models/", "s3://aws-k8s-models-0a1b2c/")
    facts = replace(fsx_facts(), model_uri=real)
    own = ServedVersion("llama@1", serving.model)
    for step in take_over(serving.model, own, STABLE_REPLICAS):
        for o in serving_objects(aws, facts, step.release):
            if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("model-server"):
                [container] = o["spec"]["template"]["spec"]["containers"]
                assert {"name": "GPUPLAT_MODEL", "value": real} in container["env"], o["metadata"]["name"]


def test_a_take_over_serves_only_the_stacks_own_files(aws: ResolvedPlatform) -> None:
    """Until the switch the stack's own Service also lists the new pods: they must serve the same model."""
    serving = aws.spec.serving
    assert serving is not None
    with pytest.raises(ReleaseRefused, match="not the stack's own model"):
        take_over(serving.model, V2, STABLE_REPLICAS)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            lambda: deploy_canary(ServingRelease(V1, canary=V2), ServedVersion("embedder@3", "/m"), 5),
            "in canary",
        ),
        (lambda: deploy_canary(ServingRelease(V1), V1, 5), "stable version already"),
        (lambda: deploy_canary(ServingRelease(V2, retiring=V1, retiring_replicas=2), V1, 5), "did not end"),
        (lambda: promote(ServingRelease(V1), 2), "no canary to promote"),
        (lambda: rollback(ServingRelease(V1)), "no canary to roll back"),
        (lambda: finish_promotion(ServingRelease(V1)), "no promotion to finish"),
        (lambda: deploy_canary(ServingRelease(V1, stack_model="serving"), V2, 5), "finish taking over"),
        (lambda: deploy_canary(ServingRelease(V1, stack_model="retiring"), V2, 5), "finish taking over"),
    ],
)
def test_steps_that_do_not_follow_from_the_release_are_refused(steps: object, message: str) -> None:
    with pytest.raises(ReleaseRefused, match=message):
        steps()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("start", "command"),
    [
        (ServingRelease(V1), lambda r: deploy_canary(r, V2, 20)),
        (ServingRelease(V1, canary=V2, canary_percent=20), lambda r: promote(r, STABLE_REPLICAS)),
        (ServingRelease(V1, canary=V2, canary_percent=20), rollback),
    ],
)
def test_a_kill_after_any_step_then_the_same_command_again_ends_where_an_unbroken_run_ends(
    aws: ResolvedPlatform, start: ServingRelease, command: Callable[[ServingRelease], list[ReleaseStep]]
) -> None:
    unbroken = command(start)
    for killed_after in range(len(unbroken) - 1):
        where = unbroken[killed_after].release
        again = command(where)
        assert again[-1].release == unbroken[-1].release, unbroken[killed_after].says
        play(aws, where, again)
