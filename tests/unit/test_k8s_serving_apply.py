"""The release driver against the official client's own transport (tests/k8s_api_fake.py): the exact
requests each step makes (verb, path, server-side apply's content type, fieldManager, force, the body
checked against the stacks' Kubernetes schemas), the waits each step names, the hand-over of the stable
workload's replicas to KEDA, the release lock as a Lease (a race answered 409), and one paragraph for an
API that refuses (403), cannot be reached, or a rollout that never ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from urllib3.exceptions import MaxRetryError

from infra.k8s.serving import GATEWAY_CONFIG, version_track_names
from infra.k8s.serving_apply import (
    APPLY_CONTENT_TYPE,
    FIELD_MANAGER,
    HANDOVER_MANAGER,
    Clock,
    ClusterApi,
    ClusterError,
    ObjectRef,
    ReleaseDriver,
    ReleaseLock,
    ReleaseLocked,
    default_holder,
    release_from_json,
    release_to_json,
    rollout_done,
    running_replicas,
)
from infra.k8s.serving_steps import deploy_canary, promote, rollback
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts
from tests.k8s_api_fake import FakeCluster, Request, rolls_out

V1 = ServedVersion("embedder@1", "s3://models/embedder/1")
V2 = ServedVersion("embedder@2", "s3://models/embedder/2")
NOW = datetime(2026, 12, 6, 20, 0, tzinfo=UTC)
NS = "serving"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpuplat-release-embedder"


@pytest.fixture(scope="module")
def aws() -> ResolvedPlatform:
    return load_platform(stack_file("aws-k8s"))


class FakeClock(Clock):
    def __init__(self) -> None:
        self.t = 0.0
        super().__init__(monotonic=lambda: self.t, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        self.t += seconds


def driver(cluster: FakeCluster, platform: ResolvedPlatform, *, timeout_s: float = 600) -> ReleaseDriver:
    api = ClusterApi(cluster.client())
    lock = ReleaseLock(api, NS, "embedder", "ci@runner pid 1", now=lambda: NOW)
    lock.acquire()
    return ReleaseDriver(api, platform, fsx_facts(), "embedder", lock, timeout_s, FakeClock())


DRAWS_20 = "use_backend inference_canary if { rand(100) lt 20 }"


def draws_for_the_canary(request: Request) -> bool:
    return (
        request.body["metadata"]["name"] == GATEWAY_CONFIG and DRAWS_20 in request.body["data"]["haproxy.cfg"]
    )


def test_each_step_is_a_forced_server_side_apply_of_schema_valid_objects(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster(before=rolls_out)
    release = ServingRelease(V1)
    driven = driver(cluster, aws)
    driven.play(deploy_canary(release, V2, 20))

    applies = cluster.applied()
    assert applies, "nothing applied"
    for request in applies:
        assert request.content_type == APPLY_CONTENT_TYPE == "application/apply-patch+yaml"
        assert request.query == {"fieldManager": FIELD_MANAGER, "force": "true"}
        # the fake checked each body against the 1.34 schemas (and the CRDs): assert it got them whole
        assert request.body["apiVersion"] and request.body["kind"]
    canary, _ = version_track_names(V2)
    assert f"{DEPLOYMENTS}/{canary}" in cluster.objects
    config = cluster.objects[f"/api/v1/namespaces/{NS}/configmaps/{GATEWAY_CONFIG}"]["data"]["haproxy.cfg"]
    assert DRAWS_20 in config
    assert driven.current() == deploy_canary(release, V2, 20)[-1].release


def test_no_share_is_drawn_before_the_canary_is_ready(aws: ResolvedPlatform) -> None:
    """The gateways' ConfigMap with the canary's share is applied only after a read of the canary's
    Deployment found its replica updated and available."""
    cluster = FakeCluster()
    canary_path = f"{DEPLOYMENTS}/{version_track_names(V2)[0]}"
    reads = {"n": 0}

    def slow_canary(request: Request, fake: FakeCluster) -> None:
        if request.verb == "GET" and request.path == canary_path:
            reads["n"] += 1
            if reads["n"] < 3:
                obj = fake.objects[canary_path]
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "replicas": 1,
                    "updatedReplicas": 1,
                    "availableReplicas": 0,
                }
                return
        rolls_out(request, fake)

    cluster.before = slow_canary
    driver(cluster, aws).play(deploy_canary(ServingRelease(V1), V2, 20))
    ready_read = [i for i, r in enumerate(cluster.requests) if r.verb == "GET" and r.path == canary_path][2]
    drawing = [i for i, r in enumerate(cluster.requests) if r.verb == "PATCH" and draws_for_the_canary(r)]
    assert reads["n"] == 3
    assert drawing and min(drawing) > ready_read


def test_rollout_that_never_completes_times_out_with_one_paragraph(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster()  # no controller: the canary's status never moves
    with pytest.raises(
        ClusterError,
        match=r"model-server-embedder-v2 \(Deployment\) did not finish its "
        r"rollout within 30 s: its latest spec is not observed yet.*run the same command again",
    ):
        driver(cluster, aws, timeout_s=30).play(deploy_canary(ServingRelease(V1), V2, 20))
    assert cluster.applied(GATEWAY_CONFIG) and not any(draws_for_the_canary(r) for r in cluster.applied())
    assert [r.verb for r in cluster.requests].count("DELETE") == 0


def test_promote_hands_the_stable_count_to_keda_without_a_moment_at_one(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster(before=rolls_out)
    canary = ServingRelease(V1, canary=V2, canary_percent=20)
    driver(cluster, aws).play(deploy_canary(ServingRelease(V1), V2, 20))
    cluster.requests.clear()
    driven = driver(cluster, aws)
    end = driven.play(promote(canary, 4))

    v2_path = f"{DEPLOYMENTS}/{version_track_names(V2)[0]}"
    v2_applies = [r for r in cluster.requests if r.verb == "PATCH" and r.path == v2_path]
    handover = [r for r in v2_applies if r.query.get("fieldManager") == HANDOVER_MANAGER]
    assert len(handover) == 1
    assert handover[0].query == {"fieldManager": HANDOVER_MANAGER}  # no force: a conflict means KEDA has it
    assert handover[0].body == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": version_track_names(V2)[0], "namespace": NS},
        "spec": {"replicas": 4},
    }
    after = v2_applies[v2_applies.index(handover[0]) + 1 :]
    assert after and all("replicas" not in r.body["spec"] for r in after), (
        "gpuplat-serve still sets the count"
    )
    before = v2_applies[: v2_applies.index(handover[0])]
    assert before[-1].body["spec"]["replicas"] == 4
    assert end == ServingRelease(V2) and driven.current() == ServingRelease(V2)
    assert f"{DEPLOYMENTS}/{version_track_names(V1)[0]}" not in cluster.objects


def test_a_handover_conflict_means_keda_owns_the_count_already(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster(before=rolls_out)
    driver(cluster, aws).play(deploy_canary(ServingRelease(V1), V2, 20))
    v2_path = f"{DEPLOYMENTS}/{version_track_names(V2)[0]}"

    def keda_first(request: Request, fake: FakeCluster) -> None:
        if request.verb == "PATCH" and request.query.get("fieldManager") == HANDOVER_MANAGER:
            fake.refuse[("PATCH", v2_path)] = (
                409,
                "Apply failed with 1 conflict: conflict with "
                '"keda-operator" using autoscaling/v2: .spec.replicas',
            )
        elif ("PATCH", v2_path) in fake.refuse:
            del fake.refuse[("PATCH", v2_path)]
        rolls_out(request, fake)

    cluster.before = keda_first
    end = driver(cluster, aws).play(promote(ServingRelease(V1, canary=V2, canary_percent=20), 4))
    assert end == ServingRelease(V2)


def test_nothing_is_deleted_while_a_terminating_gateway_pod_still_draws(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster()
    pod_path = f"/api/v1/namespaces/{NS}/pods/gateway-old"
    cluster.objects[pod_path] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gateway-old",
            "namespace": NS,
            "labels": {"gpuplat/component": "gateway"},
            "deletionTimestamp": "2026-12-06T20:00:05Z",
            "deletionGracePeriodSeconds": 60,
        },
        "spec": {"containers": [{"name": "haproxy", "image": "docker.io/library/haproxy:3.2.21"}]},
    }
    pod_reads = {"n": 0}

    def ending_pod(request: Request, fake: FakeCluster) -> None:
        if request.verb == "GET" and request.path.endswith("/pods"):
            pod_reads["n"] += 1
            if pod_reads["n"] == 3:
                fake.objects.pop(pod_path, None)
        rolls_out(request, fake)

    cluster.before = ending_pod
    driver(cluster, aws).play(rollback(ServingRelease(V1, canary=V2, canary_percent=20)))
    deletes = [i for i, r in enumerate(cluster.requests) if r.verb == "DELETE"]
    pod_lists = [i for i, r in enumerate(cluster.requests) if r.verb == "GET" and r.path.endswith("/pods")]
    assert [r.query["labelSelector"] for r in cluster.requests if r.path.endswith("/pods")] == [
        "gpuplat/component=gateway"
    ] * 3
    assert deletes and min(deletes) > pod_lists[2]
    assert {cluster.requests[i].path for i in deletes} == {
        f"{DEPLOYMENTS}/{version_track_names(V2)[0]}",
        f"/api/v1/namespaces/{NS}/services/{version_track_names(V2)[1]}",
    }


def test_a_second_run_after_the_deletes_finds_them_gone_and_ends(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster(before=rolls_out)
    steps = rollback(ServingRelease(V1, canary=V2, canary_percent=20))
    driver(cluster, aws).play(steps)
    assert driver(cluster, aws).play(steps[1:]) == ServingRelease(V1)
    statuses = [r for r in cluster.requests if r.verb == "DELETE"]
    assert len(statuses) == 4


def _workload(kind: str, generation: int, **status: int) -> dict[str, Any]:
    workload = {
        "kind": kind,
        "metadata": {"generation": generation},
        "status": {"observedGeneration": 3, **status},
    }
    return workload


def test_a_deployment_past_its_progress_deadline_ends_the_wait_at_once(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster()
    canary_path = f"{DEPLOYMENTS}/{version_track_names(V2)[0]}"

    def stuck(request: Request, fake: FakeCluster) -> None:
        if request.verb == "GET" and request.path == canary_path:
            obj = fake.objects[canary_path]
            message = 'ReplicaSet "model-server-embedder-v2-5d9f" has timed out progressing.'
            obj["status"] = {
                "observedGeneration": obj["metadata"]["generation"],
                "replicas": 1,
                "updatedReplicas": 1,
                "conditions": [
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "ProgressDeadlineExceeded",
                        "message": message,
                    }
                ],
            }
        else:
            rolls_out(request, fake)

    cluster.before = stuck
    driven = driver(cluster, aws)
    with pytest.raises(
        ClusterError, match=r"Deployment serving/model-server-embedder-v2 exceeded its progress "
    ):
        driven.play(deploy_canary(ServingRelease(V1), V2, 20))
    assert driven.clock.monotonic() == 0, "it waited for a rollout the controller gave up on"


@pytest.mark.parametrize(
    ("workload", "awaited"),
    [
        (_workload("Deployment", 4, replicas=4, updatedReplicas=4, availableReplicas=4), "not observed yet"),
        (
            _workload("Deployment", 3, replicas=4, updatedReplicas=2, availableReplicas=4),
            "2 of 4 replicas updated",
        ),
        (
            _workload("Deployment", 3, replicas=4, updatedReplicas=3, availableReplicas=4),
            "3 of 4 replicas updated",
        ),
        (
            _workload("Deployment", 3, replicas=5, updatedReplicas=4, availableReplicas=4),
            "1 old replicas pending",
        ),
        (
            _workload("Deployment", 3, replicas=4, updatedReplicas=4, availableReplicas=3),
            "3 of 4 updated replicas available",
        ),
        (_workload("Deployment", 3, replicas=4, updatedReplicas=4, availableReplicas=4), None),
        # A LeaderWorkerSet counts groups; readyReplicas is its "available".
        (
            _workload("LeaderWorkerSet", 3, replicas=2, updatedReplicas=2, readyReplicas=1),
            "1 of 2 updated replicas ready",
        ),
        (_workload("LeaderWorkerSet", 3, replicas=2, updatedReplicas=2, readyReplicas=2), None),
    ],
)
def test_a_rollout_is_done_as_kubectl_rollout_status_judges_it(
    workload: dict[str, Any], awaited: str | None
) -> None:
    said = rollout_done(workload, 4 if workload["kind"] == "Deployment" else 2)
    assert said == awaited if awaited is None else said is not None and awaited in said


# ------------------------------------------------------------------------------------------- the lock


def lock(cluster: FakeCluster, holder: str, now: datetime = NOW) -> ReleaseLock:
    return ReleaseLock(ClusterApi(cluster.client()), NS, "embedder", holder, now=lambda: now)


def test_the_lock_is_created_then_a_second_promote_meets_it_naming_the_holder() -> None:
    cluster = FakeCluster()
    lock(cluster, "ci@runner pid 1").acquire()
    post = [r for r in cluster.requests if r.verb == "POST"]
    assert post[0].path == LEASE.rsplit("/", 1)[0]
    assert post[0].body["spec"] == {
        "holderIdentity": "ci@runner pid 1",
        "leaseDurationSeconds": 60,
        "acquireTime": "2026-12-06T20:00:00.000000Z",
        "renewTime": "2026-12-06T20:00:00.000000Z",
        "leaseTransitions": 0,
    }
    writes = len(cluster.requests)
    with pytest.raises(ReleaseLocked, match=r"held by ci@runner pid 1 until 2026-12-06T20:01:00\+00:00"):
        lock(cluster, "ops@laptop pid 2", NOW + timedelta(seconds=30)).acquire()
    assert [r.verb for r in cluster.requests[writes:]] == ["GET"]


def test_an_expired_lock_is_taken_by_an_update_guarded_by_its_resource_version() -> None:
    cluster = FakeCluster()
    lock(cluster, "ci@runner pid 1").acquire()
    read_at = cluster.objects[LEASE]["metadata"]["resourceVersion"]
    lock(cluster, "ops@laptop pid 2", NOW + timedelta(seconds=61)).acquire()
    put = next(r for r in cluster.requests if r.verb == "PUT")
    assert put.path == LEASE and put.body["metadata"]["resourceVersion"] == read_at
    assert put.body["spec"]["holderIdentity"] == "ops@laptop pid 2"
    assert put.body["spec"]["leaseTransitions"] == 1


def test_two_commands_racing_for_an_expired_lock_the_second_is_refused_naming_the_first() -> None:
    cluster = FakeCluster()
    lock(cluster, "old@gone pid 9").acquire()
    later = NOW + timedelta(seconds=120)
    winner = lock(cluster, "ci@runner pid 1", later)

    def the_other_wins(request: Request, fake: FakeCluster) -> None:
        if request.verb == "PUT" and request.body["spec"]["holderIdentity"] == "ops@laptop pid 2":
            fake.before = None
            winner.acquire()  # between our read and our write

    cluster.before = the_other_wins
    with pytest.raises(ReleaseLocked, match="held by ci@runner pid 1"):
        lock(cluster, "ops@laptop pid 2", later).acquire()
    assert cluster.objects[LEASE]["spec"]["holderIdentity"] == "ci@runner pid 1"


def test_two_commands_creating_the_lock_at_once_the_second_meets_already_exists() -> None:
    cluster = FakeCluster()
    first = lock(cluster, "ci@runner pid 1")

    def the_other_creates(request: Request, fake: FakeCluster) -> None:
        if request.verb == "POST" and request.body["spec"]["holderIdentity"] == "ops@laptop pid 2":
            fake.before = None
            first.acquire()

    cluster.before = the_other_creates
    with pytest.raises(ReleaseLocked, match="held by ci@runner pid 1"):
        lock(cluster, "ops@laptop pid 2").acquire()


def test_a_released_lock_is_free_at_once() -> None:
    cluster = FakeCluster()
    held = lock(cluster, "ci@runner pid 1")
    held.acquire()
    held.release()
    assert "holderIdentity" not in cluster.objects[LEASE]["spec"]
    lock(cluster, "ops@laptop pid 2", NOW + timedelta(seconds=1)).acquire()


def test_a_lock_taken_away_while_stalled_ends_the_release(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster(before=rolls_out)
    driven = driver(cluster, aws)
    lock(cluster, "ops@laptop pid 2", NOW + timedelta(seconds=300)).acquire()
    driven.lock.now = lambda: NOW + timedelta(seconds=301)
    with pytest.raises(ReleaseLocked, match="held by ops@laptop pid 2"):
        driven.play(deploy_canary(ServingRelease(V1), V2, 20))
    assert not cluster.applied("deployments/model-server-embedder-v2")


# --------------------------------------------------------------------------------- refusals, reach


def test_a_403_names_the_verb_and_the_resource(aws: ResolvedPlatform) -> None:
    cluster = FakeCluster(before=rolls_out)
    path = f"{DEPLOYMENTS}/{version_track_names(V2)[0]}"
    cluster.refuse[("PATCH", path)] = (
        403,
        'deployments.apps "model-server-embedder-v2" is forbidden: User "ci" cannot patch resource '
        '"deployments" in API group "apps" in the namespace "serving"',
    )
    with pytest.raises(ClusterError) as refused:
        driver(cluster, aws).play(deploy_canary(ServingRelease(V1), V2, 20))
    message = str(refused.value)
    assert (
        "refused to patch deployments.apps (Deployment serving/model-server-embedder-v2): HTTP 403" in message
    )
    assert 'User "ci" cannot patch' in message and "\n" not in message


def test_an_api_that_cannot_be_reached_is_one_paragraph() -> None:
    cluster = FakeCluster(unreachable=MaxRetryError(None, "/", "connection refused"))  # type: ignore[arg-type]
    with pytest.raises(
        ClusterError,
        match=r"the Kubernetes API at https://api\.cluster\.example:6443 cannot be "
        r"reached \(MaxRetryError.*KUBECONFIG",
    ):
        lock(cluster, "ci@runner pid 1").acquire()


def test_a_missing_object_reads_as_none_not_an_error() -> None:
    api = ClusterApi(FakeCluster().client())
    assert api.get(ObjectRef("apps/v1", "Deployment", "model-server-embedder-v9", NS)) is None
    assert api.delete(ObjectRef("apps/v1", "Deployment", "model-server-embedder-v9", NS)) is False


# ------------------------------------------------------------------------------------- record, status


def test_the_release_record_round_trips() -> None:
    release = ServingRelease(V2, stable_replicas=4, retiring=V1, retiring_replicas=4)
    assert release_from_json(release_to_json(release)) == release
    with_canary = ServingRelease(V1, canary=V2, canary_percent=20, canary_replicas=2)
    assert release_from_json(release_to_json(with_canary)) == with_canary


def _pod(name: str, version: str | None, model: str, ready: bool) -> dict[str, Any]:
    labels = {"gpuplat/component": "model-server", **({"gpuplat/model-version": version} if version else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "docker.io/vllm/vllm-openai:v0.11.0",
                    "env": [{"name": "GPUPLAT_MODEL", "value": model}],
                }
            ]
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_status_reads_what_each_pod_runs() -> None:
    cluster = FakeCluster()
    for pod in (
        _pod("a", "embedder-v1", V1.model, True),
        _pod("b", "embedder-v2", V2.model, False),
        _pod("c", None, "/shared/models/embedder", True),
    ):
        cluster.objects[f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}"] = pod
    replicas = list(running_replicas(ClusterApi(cluster.client()), NS))
    assert [(r.pod, r.version, r.model, r.ready) for r in replicas] == [
        ("a", "embedder-v1", V1.model, True),
        ("b", "embedder-v2", V2.model, False),
        ("c", "(the stack's own model)", "/shared/models/embedder", True),
    ]
    assert cluster.requests[-1].query == {"labelSelector": "gpuplat/component=model-server"}


# ------------------------------------------------- KEDA's count through a release (field ownership)


def _replicas_owners(cluster: FakeCluster, path: str) -> set[str]:
    return {
        entry["manager"]
        for entry in cluster.objects[path]["metadata"].get("managedFields", [])
        if "f:replicas" in entry["fieldsV1"].get("f:spec", {})
    }


V1_PATH = f"{DEPLOYMENTS}/{version_track_names(V1)[0]}"
V2_PATH = f"{DEPLOYMENTS}/{version_track_names(V2)[0]}"


def _in_canary_keda_at(cluster: FakeCluster, aws: ResolvedPlatform, replicas: int) -> ServingRelease:
    driver(cluster, aws).play(deploy_canary(ServingRelease(V1), V2, 20))
    cluster.scale(V1_PATH, replicas)
    return ServingRelease(V1, canary=V2, canary_percent=20)


def test_promote_leaves_the_count_to_keda_alone_at_the_old_stable_count(aws: ResolvedPlatform) -> None:
    """With field ownership modelled: the new stable workload keeps 4 replicas and gpuplat-serve owns its
    count no more (had it dropped the field without the private manager, the server would reset it to 1)."""
    cluster = FakeCluster(before=rolls_out)
    canary = _in_canary_keda_at(cluster, aws, 4)
    driver(cluster, aws).play(promote(canary, 4))
    assert cluster.objects[V2_PATH]["spec"]["replicas"] == 4
    assert FIELD_MANAGER not in _replicas_owners(cluster, V2_PATH)
    cluster.scale(V2_PATH, 7)  # KEDA's first write: the private manager owns nothing after it
    assert _replicas_owners(cluster, V2_PATH) == {"kube-controller-manager"}


def test_a_promote_cut_short_at_the_switch_then_rolled_back_keeps_the_old_stable_count(
    aws: ResolvedPlatform,
) -> None:
    """KEDA grows the old stable version to 5 while the canary grows; promote's second step fixes that
    version's count at the 4 it read (taking the field from KEDA), then stops (the gateways' rollout runs
    out of time); the record still says canary. The rollback that follows gives that version every request
    again: its count must not fall to the default of 1 because gpuplat-serve, its only owner then, dropped
    the field; it goes back to KEDA."""
    cluster = FakeCluster(before=rolls_out)
    canary = _in_canary_keda_at(cluster, aws, 4)
    switched = {"at": False}

    def gateways_stall_after_the_switch(request: Request, fake: FakeCluster) -> None:
        if request.verb == "PATCH" and request.path == V2_PATH and request.body["spec"].get("replicas") == 4:
            fake.scale(V1_PATH, 5)
        if request.verb == "PATCH" and request.path == V1_PATH and "replicas" in request.body["spec"]:
            switched["at"] = True
        if switched["at"] and request.path.endswith("/deployments/gateway"):
            return
        rolls_out(request, fake)

    cluster.before = gateways_stall_after_the_switch
    driven = driver(cluster, aws, timeout_s=30)
    with pytest.raises(ClusterError, match="did not finish its rollout"):
        driven.play(promote(canary, 4))
    assert driven.current() == promote(canary, 4)[0].release
    assert cluster.objects[V1_PATH]["spec"]["replicas"] == 5, "the switch lowered KEDA's count"

    cluster.before = rolls_out
    counts: list[int] = []

    def watch_v1(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if V1_PATH in fake.objects:
            counts.append(fake.objects[V1_PATH]["spec"]["replicas"])

    cluster.before = watch_v1
    driven = driver(cluster, aws)
    driven.play(rollback(driven.current()))  # type: ignore[arg-type]
    counts.append(cluster.objects[V1_PATH]["spec"]["replicas"])
    assert min(counts) >= 4, f"the stable version's count went {counts}"
    assert FIELD_MANAGER not in _replicas_owners(cluster, V1_PATH)


def test_keda_growing_the_new_stable_version_during_the_switch_is_not_undone(aws: ResolvedPlatform) -> None:
    """Once the ScaledObject targets the new stable workload, KEDA may grow it under load while the
    gateways roll; the promotion's later steps must not force it back to the count it planned with."""
    cluster = FakeCluster(before=rolls_out)
    canary = _in_canary_keda_at(cluster, aws, 4)

    def keda_grows_during_the_gateways_rollout(request: Request, fake: FakeCluster) -> None:
        if request.verb == "GET" and request.path.endswith("/pods") and V2_PATH in fake.objects:
            so = fake.objects.get(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/model-server")
            targets_v2 = so is not None and so["spec"]["scaleTargetRef"]["name"] == version_track_names(V2)[0]
            if targets_v2 and fake.objects[V2_PATH]["spec"]["replicas"] < 6:
                fake.scale(V2_PATH, 6)
        rolls_out(request, fake)

    cluster.before = keda_grows_during_the_gateways_rollout
    driver(cluster, aws).play(promote(canary, 4))
    assert cluster.objects[V2_PATH]["spec"]["replicas"] == 6
    assert FIELD_MANAGER not in _replicas_owners(cluster, V2_PATH)


def test_two_commands_alike_in_user_host_and_pid_do_not_share_the_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two CI jobs in containers on one host (the host's name with --network host, each its own PID
    namespace) are `root@runner pid 7` both: the second must still meet the first's Lease."""
    monkeypatch.setenv("USER", "root")
    monkeypatch.setattr("socket.gethostname", lambda: "runner")
    monkeypatch.setattr("os.getpid", lambda: 7)
    cluster = FakeCluster()
    lock(cluster, default_holder()).acquire()
    with pytest.raises(ReleaseLocked, match=r"held by root@runner pid 7"):
        lock(cluster, default_holder(), NOW + timedelta(seconds=5)).acquire()


def test_a_long_wait_renews_the_lease_so_that_another_command_meets_it(aws: ResolvedPlatform) -> None:
    """The canary takes 150 s to be ready; at 100 s (past the 60 s duration) another command must still
    find the Lease held: the wait renews it at a third of the duration."""
    cluster = FakeCluster()
    clock = FakeClock()
    api = ClusterApi(cluster.client())
    held = ReleaseLock(api, NS, "embedder", "ci@runner pid 1", now=lambda: NOW + timedelta(seconds=clock.t))
    held.acquire()
    tries: list[str] = []

    def slow_canary_and_another_command(request: Request, fake: FakeCluster) -> None:
        if clock.t >= 100 and not tries:
            tries.append("trying")
            try:
                lock(fake, "ops@laptop pid 2", NOW + timedelta(seconds=clock.t)).acquire()
                tries.append("taken")
            except ReleaseLocked:
                tries.append("refused")
        if request.verb == "GET" and request.path == V2_PATH and clock.t < 150:
            obj = fake.objects[V2_PATH]
            obj["status"] = {"observedGeneration": obj["metadata"]["generation"], "replicas": 1}
            return
        rolls_out(request, fake)

    cluster.before = slow_canary_and_another_command
    ReleaseDriver(api, aws, fsx_facts(), "embedder", held, 600, clock).play(
        deploy_canary(ServingRelease(V1), V2, 20)
    )
    assert tries == ["trying", "refused"]
    assert cluster.objects[LEASE]["spec"]["holderIdentity"] == "ci@runner pid 1"


def test_the_fake_refuses_what_the_api_server_refuses() -> None:
    """The fake's own fidelity: a test that passes against it must not hang on a change a cluster refuses."""
    cluster = FakeCluster()
    api = ClusterApi(cluster.client())
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d", "v": "1"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    api.apply(deployment)
    assert cluster.objects[f"{DEPLOYMENTS}/d"]["spec"]["replicas"] == 1  # the default
    moved = {**deployment, "spec": {**deployment["spec"], "selector": {"matchLabels": {"v": "1"}}}}
    with pytest.raises(ClusterError, match=r"HTTP 422.*field is immutable"):
        api.apply(moved)
    stale = {**deployment, "metadata": {**deployment["metadata"], "resourceVersion": "1"}}
    with pytest.raises(ClusterError, match="has been modified"):
        api.apply(stale)
    lock(cluster, "ci@runner pid 1").acquire()
    unguarded = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE.rsplit("/")[-1], "namespace": NS},
        "spec": {},
    }
    with pytest.raises(ClusterError, match=r"HTTP 422.*must be specified for an update"):
        api.update(unguarded)


def test_a_canary_that_never_starts_can_be_rolled_back_as_the_error_says(aws: ResolvedPlatform) -> None:
    """deploy --canary stops in its first step (the canary never ready: a bad image) and says to run
    `gpuplat serve rollback`: the record must name the canary whose workload now exists, so that the
    rollback removes it rather than answer "no canary" and leave it holding its GPU."""
    cluster = FakeCluster()  # no controller: the canary never becomes ready
    with pytest.raises(ClusterError, match=r"did not finish its rollout.*gpuplat serve rollback"):
        driver(cluster, aws, timeout_s=30).play(deploy_canary(ServingRelease(V1), V2, 20))
    assert V2_PATH in cluster.objects
    cluster.before = rolls_out
    driven = driver(cluster, aws)
    current = driven.current()
    assert current is not None and current.canary == V2 and current.canary_percent == 0
    driven.play(rollback(current))
    assert V2_PATH not in cluster.objects and driven.current() == ServingRelease(V1)


def test_a_lease_created_by_a_cli_whose_clock_lags_is_still_live_by_the_servers_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first command creates the Lease after a GET answered 404: its times come from the server's clock
    too (the Date of that refusal), not from its own two minutes behind, which others would read as a
    Lease already expired."""
    cluster = FakeCluster(server_now=lambda: NOW)

    class SlowClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return NOW - timedelta(seconds=120)

    monkeypatch.setattr("infra.k8s.serving_apply.datetime", SlowClock)
    api = ClusterApi(cluster.client())
    ReleaseLock(api, NS, "embedder", "laggard pid 1", now=api.server_now).acquire()
    assert cluster.objects[LEASE]["spec"]["renewTime"].startswith("2026-12-06T20:00:0")
    with pytest.raises(ReleaseLocked, match="held by laggard pid 1"):
        lock(cluster, "ops@laptop pid 2", NOW + timedelta(seconds=10)).acquire()
