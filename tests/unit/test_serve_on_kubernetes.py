"""`gpuplat serve` on a Kueue stack, through the CLI, against the client's own transport
(tests/k8s_api_fake.py): what it shows, what it changes, and one paragraph with a non-zero exit where the
cluster cannot be reached, refuses, or another command holds the release."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from infra.k8s.serving import serving_objects, version_track_names
from infra.k8s.serving_apply import (
    RELEASE_RECORD,
    ClusterApi,
    ClusterError,
    ReleaseLock,
    read_record,
    record_manifest,
)
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import load_platform
from infra.serving.on_kubernetes import connect
from infra.serving.registry.mlflow import ModelVersion
from infra.spec.load import stack_file
from tests.conftest import fsx_facts
from tests.k8s_api_fake import HOST, FakeCluster, Request, rolls_out
from tests.unit.test_hostile_input import refused, run_cli

V1 = ServedVersion("embedder@1", "s3://models/embedder/1")
V2 = ServedVersion("embedder@2", "s3://models/embedder/2")
NS = "serving"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpuplat-release-embedder"


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster(before=rolls_out)
    monkeypatch.setattr("infra.cli.commands.serve.connect", lambda _platform: ClusterApi(fake.client()))
    return fake


def recorded(cluster: FakeCluster, release: ServingRelease) -> None:
    cluster.store(
        f"{CONFIGMAPS}/{RELEASE_RECORD}", record_manifest(NS, release, "s3://aws-k8s-models-1a2b/embedder")
    )


def pod(name: str, version: ServedVersion, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"gpuplat/component": "model-server", "gpuplat/model-version": version.slug},
        },
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "docker.io/vllm/vllm-openai:v0.11.0",
                    "env": [{"name": "GPUPLAT_MODEL", "value": version.model}],
                }
            ]
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_status_shows_the_release_and_what_each_pod_runs(cluster: FakeCluster) -> None:
    recorded(cluster, ServingRelease(V1, canary=V2, canary_percent=20))
    for name, version, ready in (("v1-a", V1, True), ("v2-a", V2, False)):
        cluster.objects[f"/api/v1/namespaces/{NS}/pods/{name}"] = pod(name, version, ready)
    run = run_cli("serve", "status", "embedder", "--stack", "aws-k8s", "--json")
    assert run.code == 0, run.err
    shown = json.loads(run.out)
    assert (
        shown["stable"] == "embedder@1" and shown["canary"] == "embedder@2" and shown["canary_percent"] == 20
    )
    assert [(r["pod"], r["version"], r["model"], r["ready"]) for r in shown["replicas"]] == [
        ("v1-a", "embedder-v1", V1.model, True),
        ("v2-a", "embedder-v2", V2.model, False),
    ]
    assert {r.verb for r in cluster.requests} == {"GET"}


def running(cluster: FakeCluster, release: ServingRelease, stable_replicas: int) -> None:
    """The cluster as a release left it, KEDA having scaled the stable version to `stable_replicas`."""
    recorded(cluster, release)
    platform = load_platform(stack_file("aws-k8s"))
    for manifest in serving_objects(platform, fsx_facts(), release):
        if manifest["kind"] == "Deployment":
            path = f"/apis/apps/v1/namespaces/{NS}/deployments/{manifest['metadata']['name']}"
            manifest["spec"].setdefault("replicas", stable_replicas)
            cluster.store(path, manifest)


def test_promote_plays_the_steps_and_leaves_the_lock_free(cluster: FakeCluster) -> None:
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 4)
    run = run_cli("serve", "promote", "embedder", "--stack", "aws-k8s")
    assert run.code == 0, run.err
    assert "embedder@2 serves every request" in run.out
    assert "embedder@2 grows to 4 replicas at its 20 %" in run.err
    api = ClusterApi(cluster.client())
    assert read_record(api, NS) == (ServingRelease(V2), "s3://aws-k8s-models-1a2b/embedder")
    lease = cluster.objects[LEASE]
    assert "holderIdentity" not in lease["spec"]
    assert not any(
        r.body and r.body.get("kind") in ("Namespace", "PersistentVolume") for r in cluster.applied()
    )


def test_a_second_promote_meets_the_lease_and_names_its_holder(cluster: FakeCluster) -> None:
    recorded(cluster, ServingRelease(V1, canary=V2, canary_percent=20))
    ReleaseLock(ClusterApi(cluster.client()), NS, "embedder", "ci@runner pid 7").acquire()
    run = run_cli("serve", "promote", "embedder", "--stack", "aws-k8s")
    assert run.code == 4 and run.clean, run.err
    assert "held by ci@runner pid 7" in run.err
    assert not cluster.applied()


def test_a_refusal_of_the_api_is_one_paragraph_naming_verb_and_resource(cluster: FakeCluster) -> None:
    recorded(cluster, ServingRelease(V1, canary=V2, canary_percent=20))
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/{version_track_names(V2)[0]}"
    cluster.refuse[("PATCH", path)] = (403, 'User "ci" cannot patch resource "deployments"')

    def lease_refused_after_the_patch(request: Request, fake: FakeCluster) -> None:
        if request.verb == "PATCH" and request.path == path:
            fake.refuse[("PUT", LEASE)] = (503, "etcdserver: request timed out")
        rolls_out(request, fake)

    cluster.before = lease_refused_after_the_patch
    run = run_cli("serve", "rollback", "embedder", "--stack", "aws-k8s")
    assert run.code == 4 and run.clean, run.err
    assert "refused to patch deployments.apps" in run.err and "etcdserver" not in run.err
    assert ("PUT", LEASE) in [(r.verb, r.path) for r in cluster.requests], "the lock's release was not tried"


def test_deploy_resolves_the_version_in_the_registry_given_then_starts_its_canary(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            asked.append(reference)
            return ModelVersion("embedder", 2, V2.model, "READY")

    monkeypatch.setattr("infra.cli.commands.serve.kubernetes_registry", lambda _p, url: Registry())
    recorded(cluster, ServingRelease(V1))
    run = run_cli(
        "serve", "deploy", "embedder@2", "--canary", "20", "--stack", "aws-k8s", "--registry-url", "http://r"
    )
    assert run.code == 0, run.err
    assert asked == ["embedder@2"] and "embedder@2 is in canary with 20 % of the requests" in run.out
    release, _ = read_record(ClusterApi(cluster.client()), NS)
    assert release == ServingRelease(V1, canary=V2, canary_percent=20)


def test_deploy_refuses_what_is_not_built_before_asking_anyone(cluster: FakeCluster) -> None:
    refused(
        run_cli("serve", "deploy", "embedder@2", "--canary", "20", "--stack", "aws-k8s"), "--registry-url"
    )
    assert not cluster.requests


def test_the_kubeconfig_is_read_from_the_environment_when_the_command_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": HOST}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    platform = load_platform(stack_file("aws-k8s"))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    api = connect(platform)
    assert api.server == HOST
    # urllib3's own retries off: infra/k8s/api_retry.py is the only policy (a reset write is not resent
    # unseen by it, nor a read retried three times before it counts one try).
    assert api.client.rest_client.pool_manager.connection_pool_kw["retries"].total is False
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ClusterError, match=r"no usable kubeconfig at .*missing.*aws eks update-kubeconfig"):
        connect(platform)


def test_an_unreachable_api_ends_the_command_with_one_paragraph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                # A port nothing listens on, on this machine: refused at once.
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    started = datetime.now(UTC)
    run = run_cli("serve", "status", "embedder", "--stack", "aws-k8s", env={"KUBECONFIG": str(kubeconfig)})
    assert run.code == 4 and run.clean, run.err
    assert "the Kubernetes API at http://127.0.0.1:9 cannot be reached" in run.err
    assert datetime.now(UTC) - started < timedelta(seconds=60)


def test_the_first_deploy_takes_over_from_the_stacks_own_servers_reading_their_files_where_they_do(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EKS: the stack's own model servers read `serving.model` from the purpose's generated bucket; the
    take-over's version (those files, registered) is read there too, and the record keeps where."""
    platform = load_platform(stack_file("aws-k8s"))
    stack_model = str(platform.spec.serving.model)  # type: ignore[union-attr]
    bucket_uri = stack_model.replace("s3://models/", "s3://aws-k8s-models-1a2b/")
    facts = replace(fsx_facts(), model_uri=bucket_uri)
    for manifest in serving_objects(platform, facts):
        if manifest["kind"] == "Deployment":
            manifest["spec"].setdefault("replicas", 3)
            cluster.store(
                f"/apis/apps/v1/namespaces/{NS}/deployments/{manifest['metadata']['name']}", manifest
            )

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            return ModelVersion("llama", 1, stack_model, "READY")

    monkeypatch.setattr("infra.cli.commands.serve.kubernetes_registry", lambda _p, url: Registry())
    refused(
        run_cli(
            "serve", "deploy", "llama@1", "--canary", "20", "--stack", "aws-k8s", "--registry-url", "http://r"
        ),
        "takes over from them",
    )
    run = run_cli("serve", "deploy", "llama@1", "--stack", "aws-k8s", "--registry-url", "http://r")
    assert run.code == 0, run.err
    release, uri = read_record(ClusterApi(cluster.client()), NS)
    assert release == ServingRelease(ServedVersion("llama@1", stack_model)) and uri == bucket_uri
    new = cluster.objects[f"/apis/apps/v1/namespaces/{NS}/deployments/model-server-llama-v1"]
    env = {e["name"]: e.get("value") for e in new["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUPLAT_MODEL"] == bucket_uri
    assert "replicas" not in [r for r in cluster.applied("model-server-llama-v1")][-1].body["spec"]
    assert f"/apis/apps/v1/namespaces/{NS}/deployments/model-server" not in cluster.objects


def test_a_handover_cut_short_by_a_kill_is_finished_by_the_next_command(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after promote recorded its last step, before the hand-over: the record keeps the stable
    count and gpuplat-serve applies it. The next deploy hands it to KEDA first (its count kept), so that the
    canary's steps do not force the stable workload back to that count while KEDA scales it."""
    promoted = ServingRelease(V2, stable_replicas=4)
    recorded(cluster, promoted)
    api = ClusterApi(cluster.client())
    for manifest in serving_objects(load_platform(stack_file("aws-k8s")), fsx_facts(), promoted):
        if manifest["kind"] not in ("Namespace", "PersistentVolume", "PersistentVolumeClaim"):
            api.apply(manifest)
    v2_path = f"/apis/apps/v1/namespaces/{NS}/deployments/{version_track_names(V2)[0]}"
    v3 = ServedVersion("embedder@3", "s3://models/embedder/3")

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            return ModelVersion("embedder", 3, v3.model, "READY")

    monkeypatch.setattr("infra.cli.commands.serve.kubernetes_registry", lambda _p, url: Registry())
    run = run_cli(
        "serve", "deploy", "embedder@3", "--canary", "10", "--stack", "aws-k8s", "--registry-url", "http://r"
    )
    assert run.code == 0, run.err
    release, _ = read_record(api, NS)
    assert release == ServingRelease(V2, canary=v3, canary_percent=10)
    v2 = cluster.objects[v2_path]
    assert v2["spec"]["replicas"] == 4
    entries = v2["metadata"]["managedFields"]
    owners = {e["manager"] for e in entries if "f:replicas" in e["fieldsV1"].get("f:spec", {})}
    assert owners == {"gpuplat-serve-handover-to-keda"}


def test_a_release_of_another_model_on_the_stack_is_refused_before_any_change(cluster: FakeCluster) -> None:
    """One model per stack (one record, one set of gateways): a promote of another model's name is refused
    with exit 2, its Lease let go, nothing applied."""
    recorded(cluster, ServingRelease(V1, canary=V2, canary_percent=20))
    refused(run_cli("serve", "promote", "reranker", "--stack", "aws-k8s"), "serves embedder@1")
    assert not cluster.applied() and not [r for r in cluster.requests if r.verb == "DELETE"]
    lease = cluster.objects[f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpuplat-release-reranker"]
    assert "holderIdentity" not in lease["spec"]


def test_a_cli_whose_clock_runs_ahead_still_meets_a_live_lease(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Lease is judged by the API server's clock (its Date header), not the command's: a laptop two
    minutes fast would otherwise read a Lease renewed 10 s ago as expired and take it: two releases at
    once."""
    server = datetime(2026, 12, 6, 20, 0, tzinfo=UTC)
    cluster.server_now = lambda: server
    recorded(cluster, ServingRelease(V1, canary=V2, canary_percent=20))
    renewed = server - timedelta(seconds=10)
    holder = ReleaseLock(ClusterApi(cluster.client()), NS, "embedder", "ci@runner pid 7", now=lambda: renewed)
    holder.acquire()

    class FastClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return server + timedelta(seconds=120)

    monkeypatch.setattr("infra.k8s.serving_apply.datetime", FastClock)
    run = run_cli("serve", "promote", "embedder", "--stack", "aws-k8s")
    assert run.code == 4 and run.clean, run.err
    assert "held by ci@runner pid 7 until 2026-12-06T20:00:50+00:00" in run.err
    assert not cluster.applied()


@pytest.mark.parametrize("stopped_at", ["serving", "retiring"])
def test_a_take_over_stopped_after_its_first_step_is_finished_by_the_same_deploy_again(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, stopped_at: Literal["serving", "retiring"]
) -> None:
    """Killed (or out of time) while the gateways rolled: the record says the version runs beside the
    stack's own servers (or they retire). The same deploy again finishes the take-over; another version is
    refused saying so. Before, every command refused: deploy wanted a canary, promote and rollback none."""
    platform = load_platform(stack_file("aws-k8s"))
    stack_model = str(platform.spec.serving.model)  # type: ignore[union-attr]
    version = ServedVersion("llama@1", stack_model)
    beside = ServingRelease(version, stable_replicas=3, stack_model=stopped_at)
    recorded(cluster, beside)
    api = ClusterApi(cluster.client())
    for manifest in serving_objects(platform, replace(fsx_facts(), model_uri=stack_model), beside):
        if manifest["kind"] not in ("Namespace", "PersistentVolume", "PersistentVolumeClaim"):
            api.apply(manifest)

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            return ModelVersion("llama", int(reference.partition("@")[2]), stack_model, "READY")

    monkeypatch.setattr("infra.cli.commands.serve.kubernetes_registry", lambda _p, url: Registry())
    refused(
        run_cli("serve", "deploy", "llama@2", "--stack", "aws-k8s", "--registry-url", "http://r"),
        "take-over by llama@1 from the stack's own model servers did not end: deploy llama@1 again",
    )
    run = run_cli("serve", "deploy", "llama@1", "--stack", "aws-k8s", "--registry-url", "http://r")
    assert run.code == 0, run.err
    if stopped_at == "retiring":  # the gateways already switched: not sent back to the stack's own servers
        assert run.err.strip() == "the stack's own model servers stopped", run.err
    assert read_record(api, NS)[0] == ServingRelease(version)
    assert f"/apis/apps/v1/namespaces/{NS}/deployments/model-server" not in cluster.objects
    assert (
        cluster.objects[f"/apis/apps/v1/namespaces/{NS}/deployments/model-server-llama-v1"]["spec"][
            "replicas"
        ]
        == 3
    )


def test_a_command_stalled_past_its_lease_does_not_write_over_the_new_holders_record(
    cluster: FakeCluster,
) -> None:
    """Stalled inside a step (its Lease's renewal not due yet by its clock), while another command took the
    Lease and rolled the canary back: the step's record is applied guarded by the resourceVersion this
    command read, answered 409, and the command stops with one paragraph, the other's record intact."""
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 4)
    canary = f"/apis/apps/v1/namespaces/{NS}/deployments/{version_track_names(V2)[0]}"
    taken: list[bool] = []

    def another_command_meanwhile(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if request.verb == "GET" and request.path == canary and not taken:
            taken.append(True)
            lease = json.loads(json.dumps(fake.objects[LEASE]))
            lease["spec"]["holderIdentity"] = "ci@runner pid 9"
            fake.store(LEASE, lease)
            recorded(fake, ServingRelease(V1))

    cluster.before = another_command_meanwhile
    run = run_cli("serve", "promote", "embedder", "--stack", "aws-k8s")
    assert run.code == 4 and run.clean, run.err
    assert "changed since this command read it" in run.err
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(V1)
