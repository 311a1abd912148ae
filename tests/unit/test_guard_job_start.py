"""`serve deploy ... --detach` and `serve guard --detach` on a Kueue stack: the guard Job's objects
(infra/serving/guard_job_objects.py) applied through the CLI against the API fake, which checks each
against the Kubernetes 1.34 schema (tests/k8s_schemas.py, strict: an unknown field fails), the Lease
handed to the Job, `serve status` reading the guard's record, and the zip application the Job runs, run on
a Python without the CLI's dependencies.

Not modelled: the Job controller and the kubelet (no pod starts: tests/unit/test_guard_job.py runs the
runner itself), RBAC and NetworkPolicy enforcement, the garbage collector (the ownerReferences are only
written)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.k8s.serving_apply import ClusterApi, read_record
from infra.k8s.serving_versions import ServingRelease
from infra.platform.resolve import load_platform
from infra.serving.guard_job import GUARD_RECORD, SUPERSEDED_EXIT
from infra.serving.guard_job_objects import CODE_KEY, PLAN_KEY, guard_name
from infra.serving.guard_job_start import settle_unstarted
from infra.serving.on_kubernetes import KubernetesServing
from infra.serving.registry.mlflow import ModelVersion
from infra.spec.load import stack_file
from tests.k8s_api_fake import FakeCluster, Request, rolls_out
from tests.k8s_job_cleanup import collect
from tests.k8s_schemas import assert_accepted
from tests.unit.test_hostile_input import run_cli
from tests.unit.test_serve_on_kubernetes import LEASE, NS, V1, V2, running

BATCH = f"/apis/batch/v1/namespaces/{NS}/jobs"


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster(before=rolls_out)
    monkeypatch.setattr("infra.cli.commands.serve.connect", lambda _platform: ClusterApi(fake.client()))

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            return ModelVersion("embedder", 2, V2.model, "READY")

    monkeypatch.setattr("infra.cli.commands.serve.kubernetes_registry", lambda _p, url: Registry())
    return fake


def _deploy_detach() -> Any:
    """`serve deploy embedder@2 --canary 5 --detach` on the Kueue stack."""
    return run_cli(
        "serve",
        "deploy",
        "embedder@2",
        "--canary",
        "5",
        "--detach",
        "--stack",
        "aws-k8s",
        "--registry-url",
        "r",
    )


def _configmap(cluster: FakeCluster, name: str) -> dict[str, Any]:
    return dict(cluster.objects[f"/api/v1/namespaces/{NS}/configmaps/{name}"])


def _objects(cluster: FakeCluster, kind_path: str) -> list[dict[str, Any]]:
    return [
        obj for path, obj in cluster.objects.items() if f"/{kind_path}/gpuplat-serve-guard-embedder-" in path
    ]


def test_deploy_detach_starts_the_guard_job_hands_it_the_lease_and_status_reads_its_record(
    cluster: FakeCluster,
) -> None:
    running(cluster, ServingRelease(V1), 2)
    run = _deploy_detach()
    assert run.code == 0 and run.clean, run.err
    (job,) = _objects(cluster, "jobs")
    name = job["metadata"]["name"]
    assert f"runs on as the Job {name}" in run.out
    spec = job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never" and "podFailurePolicy" in spec
    assert spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [2, SUPERSEDED_EXIT]
    assert spec["template"]["spec"]["containers"][0]["image"].startswith("docker.io/vllm/vllm-openai:")
    # The Lease is the Job's: the CLI let go of nothing in between, and a second command meets it.
    assert cluster.objects[LEASE]["spec"]["holderIdentity"] == f"job/{name}"
    again = run_cli("serve", "promote", "embedder", "--stack", "aws-k8s")
    assert again.code == 4 and f"held by job/{name}" in again.err, again.err
    # Every object the Job needs, owned by it (gone with it once its TTL passed); each passed the schema.
    for kind in ("configmaps", "serviceaccounts", "roles", "rolebindings", "networkpolicies"):
        found = _objects(cluster, kind)
        assert found, kind
        for obj in found:
            assert obj["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"], obj
            assert_accepted({k: v for k, v in obj.items() if k != "status"})
    (role,) = _objects(cluster, "roles")
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]} in role["rules"]
    assert all("resourceNames" in rule for rule in role["rules"] if rule["resources"] != ["pods"])
    plan = json.loads(_configmap(cluster, f"{name}-plan")["data"][PLAN_KEY])
    assert plan["holder"] == f"job/{name}" and plan["canary"] == "embedder@2"
    assert sorted(plan["shares"]) == ["0", "5"]
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s")
    assert status.code == 0 and f"guard: starting at 5 %: the guard Job {name} carries" in status.out, status


def test_guard_detach_refuses_without_a_canary_and_replaces_an_earlier_guards_record(
    cluster: FakeCluster,
) -> None:
    running(cluster, ServingRelease(V1), 2)
    run = run_cli("serve", "guard", "embedder", "--detach", "--stack", "aws-k8s")
    assert run.code == 2 and run.clean and "no canary of embedder" in run.err, run.err
    assert not _objects(cluster, "jobs")
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 2)
    earlier = {"guard": json.dumps({"phase": "rolled back"}), "evidence": json.dumps({"share": 20})}
    cluster.store(
        f"/api/v1/namespaces/{NS}/configmaps/{GUARD_RECORD}",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": GUARD_RECORD, "namespace": NS},
            "data": earlier,
        },
    )
    run = run_cli("serve", "guard", "embedder", "--detach", "--past-gate", "--stack", "aws-k8s")
    assert run.code == 0 and run.clean, run.err
    record = _configmap(cluster, GUARD_RECORD)["data"]
    assert set(record) == {"guard"} and json.loads(record["guard"])["phase"] == "starting", record
    (job,) = _objects(cluster, "jobs")
    plan = json.loads(_configmap(cluster, f"{job['metadata']['name']}-plan")["data"][PLAN_KEY])
    assert plan["past_gate"] is True


def test_the_jobs_code_runs_on_a_python_without_the_clis_dependencies(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    """The model-server image's python3 and nothing else: -I -S, no site-packages. Without the cluster's
    environment it says so in one line and exits 2 (the Job's pod failure policy fails the Job on it)."""
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 2)
    assert run_cli("serve", "guard", "embedder", "--detach", "--stack", "aws-k8s").code == 0
    (job,) = _objects(cluster, "jobs")
    name = job["metadata"]["name"]
    code = _configmap(cluster, f"{name}-code")["binaryData"][CODE_KEY]
    plan = _configmap(cluster, f"{name}-plan")["data"][PLAN_KEY]
    (tmp_path / "guard.pyz").write_bytes(base64.b64decode(code))
    (tmp_path / "plan.json").write_text(plan)
    ran = subprocess.run(
        [sys.executable, "-I", "-S", str(tmp_path / "guard.pyz"), "job", str(tmp_path / "plan.json")],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    assert "KUBERNETES_SERVICE_HOST" in ran.stdout and not ran.stderr, (ran.stdout, ran.stderr)


@pytest.mark.parametrize("refused_at", ["apply", "unsuspend"])
def test_a_job_refused_leaves_no_lease_handed_no_unowned_objects_and_a_stopped_record(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, refused_at: str
) -> None:
    """The Job's first apply (suspended) refused, or its unsuspend after the Lease was handed to it: the
    Lease is not left to a Job that never runs, its objects are not left unowned, the record says why."""
    monkeypatch.setattr(
        "infra.serving.guard_job_start.secrets", SimpleNamespace(token_hex=lambda _n: "abc123")
    )
    name = guard_name("embedder", "abc123")
    job_path = f"{BATCH}/{name}"
    running(cluster, ServingRelease(V1), 2)
    patches: list[object] = []

    def refuse_the_job(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if request.verb == "PATCH" and request.path == job_path:
            patches.append(request.body)
            if refused_at == "apply" or request.body["spec"].get("suspend") is False:
                fake.refuse[("PATCH", job_path)] = (403, "jobs.batch is forbidden")

    cluster.before = refuse_the_job
    run = _deploy_detach()
    assert run.code != 0 and run.clean, run.err
    # One paragraph, after the progress lines: what was not started, why, what to run.
    paragraph = run.err.strip().split("\nerror: ")[-1]
    assert "\n" not in paragraph and f"the guard Job {name} was not started" in paragraph, run.err
    assert "gpuplat serve rollback embedder" in paragraph, run.err
    assert patches and patches[0]["spec"]["suspend"] is True  # type: ignore[index]
    lease = cluster.objects[LEASE]["spec"]
    assert lease.get("holderIdentity") != f"job/{name}", lease
    record = json.loads(_configmap(cluster, GUARD_RECORD)["data"]["guard"])
    assert record["phase"] == "stopped" and "forbidden" in record["detail"], record
    for kind in ("jobs", "configmaps", "serviceaccounts", "roles", "rolebindings", "networkpolicies"):
        assert all(obj["metadata"].get("ownerReferences") for obj in _objects(cluster, kind)), kind
    assert job_path not in cluster.objects
    # The model is not locked: the next command goes on at once.
    again = run_cli("serve", "rollback", "embedder", "--stack", "aws-k8s")
    assert "held by" not in again.err, again.err


def test_status_reads_the_guard_job_the_record_names_failed_or_gone(cluster: FakeCluster) -> None:
    """The record stays at its last phase when the Job fails or is deleted: `serve status` says so."""
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 2)
    assert run_cli("serve", "guard", "embedder", "--detach", "--stack", "aws-k8s").code == 0
    (job,) = _objects(cluster, "jobs")
    path = f"{BATCH}/{job['metadata']['name']}"
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s")
    assert status.code == 0 and "; its Job: running" in status.out, status.out
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "DeadlineExceeded",
        "message": "Job was active longer",
    }
    cluster.objects[path]["status"] = {"conditions": [failed]}
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s")
    assert "guard: starting at 20 %" in status.out, status.out
    assert "its Job: failed (DeadlineExceeded: Job was active longer)" in status.out, status.out
    del cluster.objects[path]
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s", "--json")
    assert status.code == 0 and json.loads(status.out)["guard"]["job_state"] == "gone", status.out


class Killed(BaseException):
    """The command killed at that request: no handler of its errors runs (a SIGKILL runs none at all; the
    `finally` this lets run only lets go of a Lease the command no longer holds)."""


def killed_before_the_unsuspend(cluster: FakeCluster, *, before_the_hand_over: bool = False) -> str:
    """`serve guard --detach` killed as it unsuspends the Job (the Lease handed to it), or as it hands the
    Lease over (`before_the_hand_over`: the Lease still the command's); the Job's name."""
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 2)

    def kill(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        handing = request.verb == "PUT" and request.path == LEASE and before_the_hand_over
        unsuspending = request.verb == "PATCH" and f"{BATCH}/" in request.path
        if handing and str(request.body["spec"].get("holderIdentity")).startswith("job/"):
            raise Killed
        if unsuspending and request.body["spec"].get("suspend") is False:
            raise Killed

    cluster.before = kill
    serving = KubernetesServing(load_platform(stack_file("aws-k8s")), ClusterApi(cluster.client()))
    with pytest.raises(Killed):
        serving.detach_guard("embedder", None)
    cluster.before = rolls_out
    (job,) = _objects(cluster, "jobs")
    assert job["spec"]["suspend"] is True
    return str(job["metadata"]["name"])


def test_a_start_killed_after_the_hand_over_is_finished_by_the_next_command(cluster: FakeCluster) -> None:
    """The Lease is the Job's and unexpired: `serve status` finishes the start (unsuspends the Job, its
    other fields kept), and a `rollback` then meets the Job's Lease as it meets any running guard's."""
    name = killed_before_the_unsuspend(cluster)
    assert cluster.objects[LEASE]["spec"]["holderIdentity"] == f"job/{name}"
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s", "--json")
    assert status.code == 0 and json.loads(status.out)["guard"]["job_state"] == "running", status.out
    assert f"the guard Job {name}" in status.err and "was started now" in status.err, status.err
    job = cluster.objects[f"{BATCH}/{name}"]
    assert job["spec"]["suspend"] is False and job["spec"]["template"]["spec"]["containers"], job
    rollback = run_cli("serve", "rollback", "embedder", "--stack", "aws-k8s")
    assert rollback.code == 4 and rollback.clean and f"held by job/{name}" in rollback.err, rollback.err


@pytest.mark.parametrize("before_the_hand_over", [False, True])
def test_a_start_killed_whose_lease_expired_is_undone_by_the_next_command(
    cluster: FakeCluster, before_the_hand_over: bool
) -> None:
    """The Lease expired (no pod of the Job ever renewed it, or the command's own was never handed): the Job
    cannot carry the release, and the next `rollback` deletes it, writes the record `stopped`, and goes
    on with its own release."""
    now = [datetime(2026, 12, 7, tzinfo=UTC)]
    cluster.server_now = lambda: now[0]
    name = killed_before_the_unsuspend(cluster, before_the_hand_over=before_the_hand_over)
    now[0] += timedelta(seconds=61)
    rollback = run_cli("serve", "rollback", "embedder", "--stack", "aws-k8s")
    assert rollback.code == 0 and rollback.clean, rollback.err
    assert f"{BATCH}/{name}" not in cluster.objects
    record = json.loads(
        cluster.objects[f"/api/v1/namespaces/{NS}/configmaps/{GUARD_RECORD}"]["data"]["guard"]
    )
    assert record["phase"] == "stopped" and "was never started" in record["detail"], record
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(V1)


@pytest.mark.parametrize("expired", [False, True])
def test_status_by_an_identity_that_may_only_read_still_answers(cluster: FakeCluster, expired: bool) -> None:
    """`serve status` is a read: docs/serving.md grants readers `get` and `list`. Where the record names a
    start a killed command left half done, status tries to settle it (unsuspend or delete the Job), and an
    identity that may not patch or delete Jobs is refused: the status is still what it answers (the Job
    suspended, the settling said not done and left to a command that releases), not a 403 paragraph."""
    now = [datetime(2026, 12, 7, tzinfo=UTC)]
    cluster.server_now = lambda: now[0]
    name = killed_before_the_unsuspend(cluster)
    if expired:
        now[0] += timedelta(seconds=61)
    denied = 'jobs.batch is forbidden: User "reader" cannot patch or delete resource "jobs"'
    cluster.refuse[("PATCH", f"{BATCH}/{name}")] = (403, denied)
    cluster.refuse[("DELETE", f"{BATCH}/{name}")] = (403, denied)
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s", "--json")
    assert status.code == 0 and status.clean, status.err
    assert json.loads(status.out)["guard"]["job_state"] == "suspended", status.out
    assert f"the guard Job {name}" in status.err and "not settled" in status.err, status.err
    assert cluster.objects[f"{BATCH}/{name}"]["spec"]["suspend"] is True


def test_a_starter_paused_past_its_lease_does_not_bring_back_the_job_another_command_undid(
    cluster: FakeCluster,
) -> None:
    """`serve guard --detach` hands the Lease to its Job, then stalls (a laptop put to sleep) past the
    Lease's 60 s; meanwhile a `serve status` settles the start as undone: the Job deleted (its objects go
    with it) and the record `stopped`. The starter's unsuspend, a server-side apply, must not create the
    Job again: without its objects (garbage-collected with the old Job) and against the record. It carries
    the Job's uid, so that the API server refuses it (409 "uid mismatch ... no existing object was found":
    k8s.io/apiserver pkg/endpoints/handlers/patch.go, patcher.applyPatch, v1.34)."""
    now = [datetime(2026, 12, 7, tzinfo=UTC)]
    cluster.server_now = lambda: now[0]
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 2)
    said: list[str] = []

    def stalls(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        unsuspending = request.verb == "PATCH" and f"{BATCH}/" in request.path
        if unsuspending and request.body["spec"].get("suspend") is False and not said:
            now[0] += timedelta(seconds=61)
            fake.before = rolls_out
            settle_unstarted(ClusterApi(fake.client()), NS, "embedder", said.append)
            fake.before = stalls
            assert request.path not in fake.objects and "was never started" in said[0], said

    cluster.before = stalls
    serving = KubernetesServing(load_platform(stack_file("aws-k8s")), ClusterApi(cluster.client()))
    with pytest.raises(GpuPlatError):
        serving.detach_guard("embedder", None)
    assert _objects(cluster, "jobs") == [], "the Job another command deleted came back"
    record = json.loads(
        cluster.objects[f"/api/v1/namespaces/{NS}/configmaps/{GUARD_RECORD}"]["data"]["guard"]
    )
    assert record["phase"] == "stopped", record


def test_two_commands_settling_one_undone_start_at_once_both_go_on(cluster: FakeCluster) -> None:
    """A `serve status` and a `serve rollback` meet the same expired half-done start at once: the one that
    deletes the Job second meets it gone, and its write of the record `stopped` a 409 (the other wrote
    it). The start is settled all the same: neither ends on that conflict."""
    now = [datetime(2026, 12, 7, tzinfo=UTC)]
    cluster.server_now = lambda: now[0]
    name = killed_before_the_unsuspend(cluster)
    now[0] += timedelta(seconds=61)
    said: list[str] = []

    def the_other_settles_first(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if request.verb == "DELETE" and request.path == f"{BATCH}/{name}" and not said:
            said.append("")
            fake.before = rolls_out
            settle_unstarted(ClusterApi(fake.client()), NS, "embedder", said.append)
            fake.before = the_other_settles_first

    cluster.before = the_other_settles_first
    rollback = run_cli("serve", "rollback", "embedder", "--stack", "aws-k8s")
    assert rollback.code == 0 and rollback.clean, rollback.err
    assert f"{BATCH}/{name}" not in cluster.objects and "was never started" in said[1], said
    record = json.loads(
        cluster.objects[f"/api/v1/namespaces/{NS}/configmaps/{GUARD_RECORD}"]["data"]["guard"]
    )
    assert record["phase"] == "stopped", record


def test_a_finished_job_stays_a_day_for_its_logs_then_goes_with_its_objects_and_the_record_stays(
    cluster: FakeCluster,
) -> None:
    """What docs/serving.md promises of the Job's TTL, run by the TTL controller's and the garbage
    collector's rules (tests/k8s_job_cleanup.py): a day after the Job finished, not a second less, the
    Job and every object it made are deleted; the guard's record, which `serve status` reads, stays."""
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=20), 2)
    assert run_cli("serve", "guard", "embedder", "--detach", "--stack", "aws-k8s").code == 0
    (job,) = _objects(cluster, "jobs")
    finished = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)
    done = {"type": "Complete", "status": "True", "lastTransitionTime": finished.isoformat()}
    cluster.objects[f"{BATCH}/{job['metadata']['name']}"]["status"] = {"conditions": [done]}
    made = {
        path for path, obj in cluster.objects.items() if job["metadata"]["name"] in obj["metadata"]["name"]
    }
    assert len(made) == 7, sorted(made)  # the Job, 2 ConfigMaps, ServiceAccount, Role, RoleBinding, policy
    day = timedelta(days=1)
    assert not collect(cluster.objects, finished + day - timedelta(seconds=1))
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s")
    assert "; its Job: complete" in status.out, status.out
    assert collect(cluster.objects, finished + day) == made
    assert _configmap(cluster, GUARD_RECORD)["data"]["guard"]
    status = run_cli("serve", "status", "embedder", "--stack", "aws-k8s", "--json")
    assert status.code == 0 and json.loads(status.out)["guard"]["job_state"] == "gone", status.out
