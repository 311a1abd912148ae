"""The guard Job's runner (infra/serving/guard_job.py) carrying a canary inside the cluster: its own
standard-library client (infra/serving/kube_http.py) over real HTTP on the loopback, to a server that hands
each request to the API fake (tests/k8s_api_fake.py: objects, applies, Leases, resourceVersions, the
schemas), and the pods' metrics read at the pods' addresses (each pod its own loopback address, 127.0.0.N,
a real HTTP server answering the test's traffic). The plan is the CLI's (infra/serving/guard_job_plan.py).

Not modelled: TLS and the cluster CA (the client speaks plain HTTP to the loopback only when given no CA),
the NetworkPolicy that admits the guard to the pods' ports, the kubelet restarting the pod (a test runs
the runner again in a new client, as a new pod would)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from urllib3.exceptions import ProtocolError

from infra.k8s.objects import k8s_object
from infra.k8s.release_lock import ReleaseLock, ReleaseLocked
from infra.k8s.serving import GATEWAY_CONFIG
from infra.k8s.serving_apply import ClusterApi, read_record
from infra.k8s.serving_versions import ServingRelease
from infra.platform.resolve import load_platform
from infra.serving.guard_job import EVIDENCE_KEY, FIELD_MANAGER, GUARD_RECORD, SUPERSEDED_EXIT, JobPlan, run
from infra.serving.guard_job_objects import deadline_s, guard_objects
from infra.serving.guard_job_plan import job_plan
from infra.serving.kube_http import KubeHttp
from infra.serving.load import SPARSE_FACTOR, lengthened_interval_s
from infra.serving.on_kubernetes import read_guard_record
from tests.conftest import fsx_facts
from tests.k8s_api_fake import HOST, FakeCluster, rolls_out
from tests.k8s_rbac import RequestInfo, allowing_rule, bound_rules, forbidden_message, request_info_of, unused
from tests.threaded_server import serve_in_thread
from tests.unit.test_serve_guard_on_kubernetes import (
    GATEWAYS,
    Clock,
    Traffic,
    in_canary,
    serving,
    stepped_stack,
)
from tests.unit.test_serve_on_kubernetes import LEASE, NS, V1, V2

JOB = "job/gpuplat-serve-guard-embedder"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"


class ApiBridge(HTTPServer):
    """Real HTTP in, the fake's transport behind: each request as the official client would hand it over.
    A request whose bearer token is not `token` is answered 401, as the API server answers an expired one;
    one that the guard's Role (`role`, once the test rendered it) does not allow is answered 403, as RBAC
    answers (tests/k8s_rbac.py). `seen`: every authenticated request, as RBAC reads it."""

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(("127.0.0.1", 0), _Bridged)
        self.cluster = cluster
        self.token = "test-token"
        self.role: list[dict[str, Any]] | None = None
        self.user = ""
        self.seen: list[RequestInfo] = []


class _Bridged(BaseHTTPRequestHandler):
    server: ApiBridge

    def _answer(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode() or None
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._send(401, b'{"kind":"Status","message":"Unauthorized"}', {})
            return
        info = request_info_of(self.command, self.path)
        judged = [info]
        path = urlsplit(self.path).path
        if applies_a_create(self.command, self.headers.get("Content-Type"), path, self.server.cluster):
            judged.append(replace(info, verb="create"))
        for each in judged:
            self.server.seen.append(each)
            if self.server.role is not None and allowing_rule(self.server.role, each) is None:
                said = forbidden_message(each, self.server.user)
                self._send(403, json.dumps({"kind": "Status", "message": said, "code": 403}).encode(), {})
                return
        headers = {"authorization": "Bearer test-token", "Content-Type": self.headers.get("Content-Type")}
        try:
            answer = self.server.cluster.request(self.command, HOST + self.path, body=raw, headers=headers)
        except ProtocolError:  # the fake's lost answer (lose_answer): the connection closed unanswered
            self.close_connection = True
            return
        self._send(answer.status, answer.data, answer.headers)

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response_only(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, *_: Any) -> None:
        pass


def applies_a_create(method: str, content_type: str | None, path: str, cluster: FakeCluster) -> bool:
    """Whether the request is a server-side apply of an object the cluster does not hold, which the API
    server authorizes as a `create` of that name too, besides the `patch`: kubernetes
    staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go (snapshot 00f75347), PatchResource: for
    an apply patch type only, `createValidation` is wrapped by withAuthorization with
    createAuthorizerAttributes {Verb: "create", ..., Name: name}, the name from the request's path; the
    patcher's applyPatch calls the apply mechanism's createNewObject where the object has no UID (a JSON
    or strategic merge patch answers NotFound there instead)."""
    return method == "PATCH" and "apply-patch" in (content_type or "") and path not in cluster.objects


class PodServer(HTTPServer):
    """One pod's server at its own loopback address: `/metrics` answers `text()`; `asked` counts."""

    def __init__(self, address: tuple[str, int], text: Callable[[], str]) -> None:
        super().__init__(address, _PodHandler)
        self.text = text
        self.asked = 0


class _PodHandler(BaseHTTPRequestHandler):
    server: PodServer

    def do_GET(self) -> None:
        self.server.asked += 1
        data = self.server.text().encode() if self.path == "/metrics" else b""
        self.send_response(200 if data else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


def _serve(server: HTTPServer) -> None:
    serve_in_thread(server)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> FakeCluster:
    return FakeCluster(before=rolls_out, server_now=lambda: datetime.fromtimestamp(clock.now, UTC))


@pytest.fixture
def bridge(cluster: FakeCluster) -> Iterator[ApiBridge]:
    server = ApiBridge(cluster)
    _serve(server)
    yield server
    server.shutdown()
    server.server_close()


class Pods:
    """Each pod of `in_canary` at its own loopback address, its server on the port the plan names."""

    def __init__(self, cluster: FakeCluster, traffic: Traffic) -> None:
        self.servers: dict[str, PodServer] = {}
        self.ports: dict[str, int] = {}
        answers = {pod: text for (pod, _port), text in cluster.pod_answers.items()}
        cluster.pod_answers.clear()  # the proxy is not the Job's way: a look through it would fail
        for index, (pod, text) in enumerate(sorted(answers.items()), 2):
            address = f"127.0.0.{index}"
            component = "gateway" if pod in GATEWAYS else "model-server"
            server = PodServer((address, self.ports.get(component, 0)), text)
            self.ports[component] = server.server_address[1]
            self.servers[pod] = server
            cluster.objects[f"/api/v1/namespaces/{NS}/pods/{pod}"]["status"]["podIP"] = address
            _serve(server)

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


@pytest.fixture
def release(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock
) -> Iterator[Callable[[Traffic], tuple[JobPlan, Pods]]]:
    """V2 in canary at 20 % on the stack with a 2-interval analysis; the CLI's plan for the Job (the pods'
    ports those of the test's servers), its guard record written, the Lease handed to the Job's holder."""
    made: list[Pods] = []

    def make(traffic: Traffic, servers: tuple[int, int] = (0, 0)) -> tuple[JobPlan, Pods]:
        in_canary(cluster, traffic)
        pods = Pods(cluster, traffic)
        made.append(pods)
        platform = load_platform(stepped_stack(tmp_path))
        current = ServingRelease(V1, canary=V2, canary_percent=20)
        plan = job_plan(
            platform, fsx_facts(), current, "s3://aws-k8s-models-1a2b/embedder", JOB, servers=servers
        )
        assert (plan.names.gateway_port, plan.names.server_port) == (8404, 8000)
        names = replace(
            plan.names, gateway_port=pods.ports["gateway"], server_port=pods.ports["model-server"]
        )
        api = ClusterApi(cluster.client())
        api.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": GUARD_RECORD, "namespace": NS},
                "data": {"guard": json.dumps({"model": "embedder", "phase": "starting", "by": JOB})},
            }
        )
        # The gateways' configuration, as `serve deploy` renders it with them (infra/k8s/serving.py).
        api.create(k8s_object("v1", "ConfigMap", GATEWAY_CONFIG, NS, data={"haproxy.cfg": "# deployed"}))
        cli = ReleaseLock(api, NS, "embedder", "ci@runner pid 7 ab12", now=api.server_now)
        cli.acquire()
        cli.hand_to(JOB)
        bridge.role, bridge.user = guard_role(plan)
        return replace(plan, names=names), pods

    yield make
    for pods in made:
        pods.close()


def guard_role(plan: JobPlan) -> tuple[list[dict[str, Any]], str]:
    """The rules the objects the CLI renders for the Job of `plan` give its pod (the user its token is,
    from the Job's serviceAccountName, which must name the ServiceAccount rendered with it), and that user."""
    name = plan.holder.removeprefix("job/")
    objects = guard_objects(plan, name, {"containers": [{"image": "docker.io/vllm/vllm-openai:v0.10.1"}]})
    (job,) = [o for o in objects if o["kind"] == "Job"]
    namespace, account = job["metadata"]["namespace"], job["spec"]["template"]["spec"]["serviceAccountName"]
    accounts = [
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "ServiceAccount"
    ]
    assert (namespace, account) in accounts, (
        f"no ServiceAccount {account} rendered: the Job's pods would not start"
    )
    user = f"system:serviceaccount:{namespace}:{account}"
    return [dict(rule) for rule in bound_rules(objects, user, namespace)], user


def job_api(bridge: ApiBridge, tmp_path: Path) -> KubeHttp:
    token = tmp_path / "token"
    token.write_text(bridge.token + "\n")
    return KubeHttp(f"http://127.0.0.1:{bridge.server_address[1]}", token, None, FIELD_MANAGER)


def test_a_canary_failing_every_request_is_rolled_back_by_the_job(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    plan, pods = release(Traffic(clock, canary_errors=1.0))
    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=said.append) == 0
    api = ClusterApi(cluster.client())
    # The gateways take no request to the canary; its workload is the operator's `serve rollback`.
    assert read_record(api, NS)[0] == ServingRelease(V1, canary=V2, canary_percent=0)
    record = read_guard_record(api, NS)
    assert record is not None and record["phase"] == "rolled back" and record["by"] == JOB, record
    # Read at the pods' addresses, never through the API server's proxy.
    assert all(server.asked for server in pods.servers.values())
    assert not [r.path for r in cluster.requests if "/proxy/" in r.path]
    applied = {r.path.rsplit("/", 1)[1] for r in cluster.applied()}
    assert applied == {"gateway-haproxy", "gateway", "gpuplat-serve-release"}, applied
    assert "holderIdentity" not in cluster.objects[LEASE]["spec"]  # let go once the release ended


def test_an_identical_canary_is_promote_ready_and_the_token_is_read_again_at_each_call(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    plan, _pods = release(Traffic(clock))
    api = job_api(bridge, tmp_path)
    looks = 0

    def sleep(seconds: float) -> None:
        nonlocal looks
        looks += 1
        if looks == 2:  # the kubelet rotates the projected token: the old one is refused from now on
            api.token.write_text("rotated-token")
            bridge.token = "rotated-token"
        clock.sleep(seconds)

    assert run(api, plan, sleep=sleep) == 0
    assert looks > 2
    client = ClusterApi(cluster.client())
    assert read_record(client, NS)[0] == ServingRelease(V1, canary=V2, canary_percent=20)
    record = read_guard_record(client, NS)
    assert record is not None and record["phase"] == "promote-ready", record


def test_the_job_judges_the_canary_at_the_equal_load_share_its_plan_renders(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """1 canary and 7 stable servers up when the CLI looked: the plan renders 12 % (infra/serving/load.py)
    beside 20 % and 0 %, and the Job analyses 20 %, then 12 %, and puts the share back to 20 %."""
    plan, _pods = release(Traffic(clock, servers=(1, 7)), servers=(1, 7))
    assert sorted(plan.shares) == [0, 12, 20]
    again = JobPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.servers == (1, 7)
    # 12 % is below the stack's smallest share, 20 %: the plan carries the longer intervals the Job's loop
    # gives that analysis (carry.step_rules), which its deadline counts.
    interval_s = lengthened_interval_s(plan.rules.interval_s, 12, 20)
    assert interval_s > plan.rules.interval_s
    assert plan.added_interval_s == again.added_interval_s == interval_s
    assert deadline_s(plan) > deadline_s(replace(plan, added_interval_s=None))
    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=said.append) == 0
    assert "the equal-load analysis (12 %): the canary takes 12 % of the requests" in said, said
    assert (
        f"the equal-load analysis (12 %): intervals of {interval_s} s, for as many canary requests "
        "each as at 20 %" in said
    ), said
    assert "both analyses passed: the canary's share goes back to 20 %" in said, said
    client = ClusterApi(cluster.client())
    assert read_record(client, NS)[0] == ServingRelease(V1, canary=V2, canary_percent=20)
    record = read_guard_record(client, NS)
    assert record is not None and record["phase"] == "promote-ready", record


class Killed(BaseException):
    """The pod killed (SIGKILL, its node lost) while the guard sleeps between two looks."""


def test_a_pod_restarted_in_the_equal_load_analysis_resumes_it_and_puts_the_share_back(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """Killed while it analyses 12 % (its analysis at 20 % passed): the new pod finds the canary at 12 %,
    goes on with that analysis, not again from 20 %, and ends the release at 20 %, the plan's share."""
    plan, _pods = release(Traffic(clock, servers=(1, 7)), servers=(1, 7))
    said: list[str] = []

    def killed_in_the_equal_load_analysis(seconds: float) -> None:
        if any(line.startswith("the equal-load analysis (12 %): the canary takes") for line in said):
            raise Killed
        clock.sleep(seconds)

    with pytest.raises(Killed):
        run(job_api(bridge, tmp_path), plan, sleep=killed_in_the_equal_load_analysis, say=said.append)
    api = ClusterApi(cluster.client())
    assert read_record(api, NS)[0] == ServingRelease(V1, canary=V2, canary_percent=12)
    again: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=again.append) == 0
    assert not any("the canary takes 20 %" in line for line in again), again
    assert "both analyses passed: the canary's share goes back to 20 %" in again, again
    assert read_record(api, NS)[0] == ServingRelease(V1, canary=V2, canary_percent=20)
    record = read_guard_record(api, NS)
    assert record is not None and record["phase"] == "promote-ready", record


def test_a_pod_restarted_mid_release_resumes_the_counts_and_a_promote_meets_the_lease_meanwhile(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    plan, _pods = release(Traffic(clock))
    looks = 0

    def killed_at_the_fourth(seconds: float) -> None:
        nonlocal looks
        looks += 1
        if looks == 4:
            raise Killed
        clock.sleep(seconds)

    with pytest.raises(Killed):
        run(job_api(bridge, tmp_path), plan, sleep=killed_at_the_fourth)
    api = ClusterApi(cluster.client())
    kept = json.loads(cluster.objects[f"{CONFIGMAPS}/{GUARD_RECORD}"]["data"][EVIDENCE_KEY])
    assert kept["share"] == 20 and kept["verdict"] == "continue", kept
    # The Job's Lease outlives its pod: a promote meanwhile is refused, naming the Job.
    with pytest.raises(ReleaseLocked) as refused:
        serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).promote("embedder")
    assert refused.value.holder == JOB
    # The new pod, after the analysis' time ran out: a new client, the same plan; it goes on from the
    # evidence, not from its own first look, and judges it.
    clock.sleep(10)
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep) == 0
    ended = json.loads(cluster.objects[f"{CONFIGMAPS}/{GUARD_RECORD}"]["data"][EVIDENCE_KEY])
    assert ended["watch"]["started_s"] == kept["watch"]["started_s"], (kept, ended)
    record = read_guard_record(api, NS)
    assert record is not None and record["phase"] == "promote-ready", record
    # A pod started again after the end (its Job retried) finds the release over and changes nothing.
    before = len(cluster.applied())
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep) == 0
    assert len(cluster.applied()) == before


def test_a_job_whose_lease_another_command_took_stops_without_a_change(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    plan, _pods = release(Traffic(clock, canary_errors=1.0))
    clock.sleep(120)  # the Job never started: its Lease expired, and an operator's command took it
    api = ClusterApi(cluster.client())
    ReleaseLock(api, NS, "embedder", "ops@laptop pid 9 cd34", now=api.server_now).acquire()
    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=said.append) == SUPERSEDED_EXIT
    assert "ops@laptop" in said[-1], said
    assert not cluster.applied() and read_record(api, NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )


def test_a_job_whose_lease_was_deleted_stops_with_the_superseded_exit_not_a_403(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """The Lease deleted between the CLI's hand-over and the pod's start (or between two pods): the Job
    creates none (its Role could not grant a create, a POST carrying no name), it is no longer its
    release: exit 10, which fails the Job at once, rather than a 403 retried to backoffLimit."""
    plan, _pods = release(Traffic(clock, canary_errors=1.0))
    del cluster.objects[LEASE]
    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=said.append) == SUPERSEDED_EXIT
    assert "no one (its Lease was deleted)" in said[-1], said
    assert "forbidden" not in " ".join(said).lower() and not cluster.applied(), said


def test_a_refused_token_is_one_paragraph_naming_the_call_and_the_guards_role(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    plan, _pods = release(Traffic(clock))
    api = job_api(bridge, tmp_path)
    bridge.token = "another-token"  # the ServiceAccount deleted and made again: its old tokens are refused
    said: list[str] = []
    assert run(api, plan, sleep=clock.sleep, say=said.append) == 4
    assert said[-1].startswith("the Kubernetes API at http://127.0.0.1:"), said
    assert "refused GET on leases.coordination.k8s.io" in said[-1] and "HTTP 401" in said[-1], said
    assert "Traceback" not in "".join(said)


def test_a_pod_stopped_by_an_error_says_so_in_the_record_and_the_next_pod_resumes(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """An error the Job retries (its rollback's patch refused): the record says why the pod stopped, in a
    phase that is not an end, so that `serve status` does not show the last look's phase forever."""
    plan, _pods = release(Traffic(clock, canary_errors=1.0))
    cluster.refuse[("PATCH", f"{CONFIGMAPS}/gateway-haproxy")] = (403, "configmaps is forbidden")
    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=said.append) == 4
    record = read_guard_record(ClusterApi(cluster.client()), NS)
    assert record is not None and record["phase"] == "interrupted", record
    assert "configmaps is forbidden" in record["detail"] and record["canary_percent"] == 20, record
    del cluster.refuse[("PATCH", f"{CONFIGMAPS}/gateway-haproxy")]
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep) == 0
    record = read_guard_record(ClusterApi(cluster.client()), NS)
    assert record is not None and record["phase"] == "rolled back", record


def test_a_lease_taken_at_a_look_ends_the_job_with_the_superseded_exit(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """The pod stalled past its Lease and an operator's command took it: exit 10 (the pod failure policy
    fails the Job at once, no retry), not 5, and the record is left to that command."""
    plan, _pods = release(Traffic(clock))
    api = ClusterApi(cluster.client())
    looks = 0

    def taken_at_the_second(seconds: float) -> None:
        nonlocal looks
        looks += 1
        clock.sleep(seconds)
        if looks == 2:
            clock.sleep(120)
            ReleaseLock(api, NS, "embedder", "ops@laptop pid 9 cd34", now=api.server_now).acquire()

    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=taken_at_the_second, say=said.append) == SUPERSEDED_EXIT
    assert "ops@laptop" in said[-1] and not any("look failed" in line for line in said), said
    record = read_guard_record(api, NS)
    assert record is not None and record["phase"] != "interrupted", record


def test_the_role_allows_every_call_of_a_rollback_and_grants_nothing_it_does_not_make(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """Least privilege, proven on the runner's real requests: the bridge answers 403 to any the rendered
    Role does not allow (in every test of this file), and a rollback, the path that changes the most (the
    Lease taken and renewed, the pods listed, both records read, the guard's written, each object of share
    0 applied, the gateways' rollout read), uses every grant of the Role: none is beyond need. Its
    gateways' ConfigMap deleted by hand, the apply of share 0 creates it again (a `create` by name)."""
    seen = _rollback_without_the_gateway_config(tmp_path, cluster, bridge, clock, release)
    assert bridge.role is not None and seen
    assert all(allowing_rule(bridge.role, info) is not None for info in seen)
    assert not unused(bridge.role, seen), sorted(unused(bridge.role, seen))


def test_the_role_allows_nothing_wider_than_the_requests_a_rollback_makes(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> None:
    """What the grant-by-grant test cannot see (a rule's grants each used, the rule wider: its
    resourceNames dropped, `*` for its group or resources): every request the Role allows, over verbs,
    groups, resources, subresources and names the guard might reach, is one the rollback made."""
    seen = _rollback_without_the_gateway_config(tmp_path, cluster, bridge, clock, release)
    made = {(i.verb, i.api_group, i.resource, i.subresource, i.name) for i in seen}
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "proxy")
    groups = ("", "apps", "coordination.k8s.io", "batch", "rbac.authorization.k8s.io")
    resources = ("pods", "configmaps", "secrets", "deployments", "statefulsets", "leases", "jobs", "roles")
    names = {"", "gpuplat-another", *(i.name for i in seen)}
    assert bridge.role is not None
    wider = sorted(
        (verb, group, resource, sub, name)
        for verb in verbs
        for group in groups
        for resource in resources
        for sub in ("", "status", "scale", "exec")
        for name in names
        if (verb, group, resource, sub, name) not in made
        and (verb, group, resource, sub, "") not in made  # a list's name is no part of what RBAC reads
        and allowing_rule(bridge.role, RequestInfo(verb, group, NS, resource, sub, name)) is not None
    )
    assert not wider, wider[:10]


def _rollback_without_the_gateway_config(
    tmp_path: Path, cluster: FakeCluster, bridge: ApiBridge, clock: Clock, release: Any
) -> list[RequestInfo]:
    """A rollback, the path that changes the most, its gateways' ConfigMap deleted by hand before: the
    requests it made, as RBAC read them."""
    plan, _pods = release(Traffic(clock, canary_errors=1.0))
    del cluster.objects[f"{CONFIGMAPS}/{GATEWAY_CONFIG}"]
    said: list[str] = []
    assert run(job_api(bridge, tmp_path), plan, sleep=clock.sleep, say=said.append) == 0, said[-3:]
    assert "haproxy.cfg" in cluster.objects[f"{CONFIGMAPS}/{GATEWAY_CONFIG}"]["data"]
    return bridge.seen


def test_the_plan_carries_the_longer_intervals_below_equal_load_that_whole_percents_leave(
    tmp_path: Path,
) -> None:
    """1 canary beside 20 stable servers: no whole percent loads them alike within the tolerance, the Job
    adds 4 % (0.83 x) with intervals SPARSE_FACTOR times longer than 20 / 4 makes them (load.py), which
    the plan must carry for the Job's deadline to count them; beside 7, 12 % is within it."""
    platform = load_platform(stepped_stack(tmp_path))
    current = ServingRelease(V1, canary=V2, canary_percent=20)
    source = "s3://aws-k8s-models-1a2b/embedder"
    sparse = job_plan(platform, fsx_facts(), current, source, JOB, servers=(1, 20))
    dense = job_plan(platform, fsx_facts(), current, source, JOB, servers=(1, 7))
    interval_s = sparse.rules.interval_s
    assert sparse.added_interval_s == SPARSE_FACTOR * lengthened_interval_s(interval_s, 4, 20)
    assert dense.added_interval_s == lengthened_interval_s(interval_s, 12, 20)
