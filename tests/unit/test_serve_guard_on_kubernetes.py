"""The canary's guard in the foreground on a Kueue stack (`serve deploy --canary P --guard-s N`, `serve
guard`): the nodes' analysis loop (infra/serving/carry.py) fed from each gateway pod's HAProxy exporter and
each model-server pod's /metrics, read through the API server's pods/proxy subresource, against the
official client's own transport (tests/k8s_api_fake.py) and a clock the test moves. The figures are the
test's: each gateway pod takes half the requests, each version's model-server pod records their latency.

Not modelled (tests/k8s_api_fake.py): the NetworkPolicies between the API server and the pods, the gateway
pods' restarts when a share step rolls them (their counters start again from zero under new names)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.k8s.api_retry import ATTEMPTS
from infra.k8s.serving import CANARY_BACKEND, GATEWAY_BACKEND, version_track_names
from infra.k8s.serving_apply import Clock as DriverClock
from infra.k8s.serving_apply import ClusterApi, ReleaseLocked, read_record
from infra.k8s.serving_versions import ServingRelease
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.serving.analysis import INCONCLUSIVE, PROMOTE_READY, ROLLBACK
from infra.serving.on_kubernetes import GUARD_RECORD, KubernetesServing, read_guard_record
from infra.serving.registry.mlflow import ModelVersion
from tests.k8s_api_fake import FakeCluster, Request, rolls_out
from tests.unit.test_hostile_input import run_cli, write_variant
from tests.unit.test_serve_on_kubernetes import LEASE, NS, V1, V2, recorded, running

BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, math.inf)
# Where each version's answers fall (per bucket of BOUNDS): the same shape for an identical canary.
FAST = (0.2, 0.5, 0.2, 0.1, 0.0, 0.0)
SLOW = (0.0, 0.0, 0.1, 0.2, 0.5, 0.2)
GATEWAYS = ("gateway-7d9f-a", "gateway-7d9f-b")
TTFT = "vllm:time_to_first_token_seconds"


@dataclass
class Clock:
    now: float = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Traffic:
    """Requests since the pods started, at steady rates, on the test's clock."""

    clock: Clock
    stable_rps: float = 40.0
    canary_rps: float = 10.0
    canary_errors: float = 0.0
    canary_shape: tuple[float, ...] = FAST
    since: float = field(init=False)
    restarted: dict[str, float] = field(default_factory=dict)
    """pod -> when its counters started again (a restarted container)"""
    servers: tuple[int, int] = (0, 0)
    """the canary's servers and the stable's each gateway pod counts up; none: the guard weighs no load and
    adds no equal-load analysis (infra/serving/load.py; tested with servers up below)"""

    def __post_init__(self) -> None:
        self.since = self.clock.now - 30

    def _seconds(self, pod: str) -> float:
        return self.clock.now - max(self.since, self.restarted.get(pod, self.since))

    def requests(self, backend: str, pod: str) -> int:
        rate = self.stable_rps if backend == GATEWAY_BACKEND else self.canary_rps
        return int(rate / len(GATEWAYS) * self._seconds(pod))

    def exporter(self, gateway: str) -> str:
        lines = []
        for backend in (GATEWAY_BACKEND, CANARY_BACKEND):
            requests = self.requests(backend, gateway)
            failed = int(requests * self.canary_errors) if backend == CANARY_BACKEND else 0
            lines += [
                f'haproxy_backend_sessions_total{{proxy="{backend}"}} {requests}',
                f'haproxy_backend_http_responses_total{{proxy="{backend}",code="2xx"}} {requests - failed}',
                f'haproxy_backend_http_responses_total{{proxy="{backend}",code="5xx"}} {failed}',
                f'haproxy_backend_active_servers{{proxy="{backend}"}} {self.up(backend)}',
            ]
        return "\n".join(lines) + "\n"

    def up(self, backend: str) -> int:
        return self.servers[0] if backend == CANARY_BACKEND else self.servers[1]

    def model_server(self, backend: str, pod: str) -> str:
        rate = self.stable_rps if backend == GATEWAY_BACKEND else self.canary_rps
        answered = int(rate * self._seconds(pod))
        shape = FAST if backend == GATEWAY_BACKEND else self.canary_shape
        lines, cumulative, total_s = [], 0, 0.0
        for index, (bound, share) in enumerate(zip(BOUNDS, shape, strict=True)):
            count = int(answered * share)
            cumulative += count
            middle = (bound + (BOUNDS[index - 1] if index else 0.0)) / 2 if math.isfinite(bound) else 2.0
            total_s += count * middle
            le = "+Inf" if math.isinf(bound) else str(bound)
            lines.append(f'{TTFT}_bucket{{le="{le}",model_name="m"}} {cumulative}')
        lines += [f'{TTFT}_sum{{model_name="m"}} {total_s}', f'{TTFT}_count{{model_name="m"}} {cumulative}']
        return "\n".join(lines) + "\n"


def pod(name: str, component: str, version_slug: str | None = None) -> dict[str, Any]:
    labels = {"gpuplat/component": component}
    if version_slug:
        labels["gpuplat/model-version"] = version_slug
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": component, "image": "example.org/image:1"}]},
        "status": {"phase": "Running", "podIP": "10.1.0.9"},
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster(before=rolls_out)
    monkeypatch.setattr("infra.cli.commands.serve.connect", lambda _platform: ClusterApi(fake.client()))
    return fake


def stepped_stack(tmp_path: Path, **canary: Any) -> Path:
    def analysed(platform: dict[str, Any]) -> None:
        platform["serving"]["canary"] = {"interval_s": 10, "intervals": 2, "min_requests": 20, **canary}

    return write_variant(tmp_path, "aws-k8s", analysed, name="aws-k8s-guarded")


def in_canary(cluster: FakeCluster, traffic: Traffic, percent: int = 20) -> None:
    """V2 in canary beside V1: the workloads, the release record, two gateway pods and one model-server
    pod per version, each answering through pods/proxy from `traffic`."""
    running(cluster, ServingRelease(V1, canary=V2, canary_percent=percent), 2)
    for name in GATEWAYS:
        cluster.objects[f"/api/v1/namespaces/{NS}/pods/{name}"] = pod(name, "gateway")
        cluster.pod_answers[(name, 8404)] = partial(traffic.exporter, name)
    for name, version, backend in (("v1-a", V1, GATEWAY_BACKEND), ("v2-a", V2, CANARY_BACKEND)):
        cluster.objects[f"/api/v1/namespaces/{NS}/pods/{name}"] = pod(name, "model-server", version.slug)
        cluster.pod_answers[(name, 8000)] = partial(traffic.model_server, backend, name)


def serving(
    platform: ResolvedPlatform, cluster: FakeCluster, clock: Clock, said: list[str]
) -> KubernetesServing:
    return KubernetesServing(
        platform, ClusterApi(cluster.client()), said.append, clock=DriverClock(clock.monotonic, clock.sleep)
    )


def test_a_canary_failing_every_request_is_rolled_back_with_the_rollback_steps(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    traffic = Traffic(clock, canary_errors=1.0)
    in_canary(cluster, traffic)
    said: list[str] = []
    platform = load_platform(stepped_stack(tmp_path))
    verdict = serving(platform, cluster, clock, said).guard("embedder", None)
    assert verdict.action == ROLLBACK and "sequential test" in verdict.reason, verdict
    api = ClusterApi(cluster.client())
    assert read_record(api, NS)[0] == ServingRelease(V1)
    assert f"/apis/apps/v1/namespaces/{NS}/deployments/{version_track_names(V2)[0]}" not in cluster.objects
    assert any("takes no new request" in line for line in said), said
    record = read_guard_record(api, NS)
    assert record is not None and record["phase"] == "rolled back", record
    proxied = [r.path for r in cluster.requests if "/proxy/" in r.path]
    assert f"/api/v1/namespaces/{NS}/pods/{GATEWAYS[1]}:8404/proxy/metrics" in proxied
    assert f"/api/v1/namespaces/{NS}/pods/v2-a:8000/proxy/metrics" in proxied
    assert "holderIdentity" not in cluster.objects[LEASE]["spec"]


def test_an_identical_canary_is_promote_ready_on_both_gateways_counts_and_is_left_to_the_operator(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    traffic = Traffic(clock)
    in_canary(cluster, traffic)
    started = clock.now
    platform = load_platform(stepped_stack(tmp_path))
    verdict = serving(platform, cluster, clock, []).guard("embedder", None)
    assert verdict.action == PROMOTE_READY, verdict
    # Counted from the first look, both gateway pods summed: 10 requests/s for the 20 s of the analysis.
    elapsed = clock.now - started
    counted = int(verdict.reason.split("canary error rate 0.0% (0/")[1].split(")")[0])
    assert counted == sum(
        traffic.requests(CANARY_BACKEND, g) - int(5 * (started - traffic.since)) for g in GATEWAYS
    ), (counted, elapsed)
    assert counted > traffic.requests(CANARY_BACKEND, GATEWAYS[0]) - int(5 * (started - traffic.since))
    # Promote stays the operator's: the canary keeps its share.
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )


def test_a_slower_canary_is_rolled_back_for_latency_alone(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    in_canary(cluster, Traffic(clock, canary_shape=SLOW))
    verdict = serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert verdict.action == ROLLBACK and "took longer than" in verdict.reason, verdict
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(V1)


def test_a_model_server_pod_restarted_mid_analysis_counts_from_zero_not_backwards(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """A restarted container starts its histogram again: the analysis counts its new answers (Prometheus'
    increase()), it does not read a negative interval and roll back or stop."""
    traffic = Traffic(clock)
    in_canary(cluster, traffic)

    def restart_once(request: Request, fake: FakeCluster) -> None:
        if clock.now >= 1012 and "v2-a" not in traffic.restarted:
            traffic.restarted["v2-a"] = clock.now
        rolls_out(request, fake)

    cluster.before = restart_once
    verdict = serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert verdict.action == PROMOTE_READY, verdict


def test_steps_move_the_share_through_the_gateways_and_the_last_promotes(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    traffic = Traffic(clock)
    in_canary(cluster, traffic, percent=10)
    shares: list[int] = []

    def follow_share(request: Request, fake: FakeCluster) -> None:
        if request.verb == "PATCH" and request.path.endswith(f"configmaps/{GUARD_RECORD}"):
            shares.append(json.loads(request.body["data"]["guard"])["canary_percent"] or 0)
        rolls_out(request, fake)

    cluster.before = follow_share
    steps = [{"percent": 10}, {"percent": 30}, {"percent": 100}]
    platform = load_platform(stepped_stack(tmp_path, steps=steps))
    verdict = serving(platform, cluster, clock, []).guard("embedder", None)
    assert verdict.action == "promoted", verdict
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(V2)
    gateway_configs = [
        r.body["data"] for r in cluster.applied("configmaps/gateway-haproxy") if r.body and "data" in r.body
    ]
    assert any("30" in json.dumps(data) for data in gateway_configs)
    assert 30 in shares and shares[-1] == 100


def test_a_canary_on_1_server_beside_7_is_judged_at_the_equal_load_share_then_put_back(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """The gateway pods' exporters count 1 canary and 7 stable servers up (serving.canary.gpus borrow on 8
    replicas): at 20 % each canary server takes 1.75 x a stable one's load, so the guard (carry.guard, as
    on the nodes) analyses 20 %, then 12 %, the share that loads them alike (infra/serving/load.py), and
    puts the share back to 20 %."""
    in_canary(cluster, Traffic(clock, servers=(1, 7)))
    shares: list[int] = []

    def follow_share(request: Request, fake: FakeCluster) -> None:
        if request.verb == "PATCH" and request.path.endswith(f"configmaps/{GUARD_RECORD}"):
            shares.append(json.loads(request.body["data"]["guard"])["canary_percent"])
        rolls_out(request, fake)

    cluster.before = follow_share
    said: list[str] = []
    verdict = serving(load_platform(stepped_stack(tmp_path)), cluster, clock, said).guard("embedder", None)
    assert verdict.action == PROMOTE_READY, verdict
    assert any("each of the 1 canary server(s)" in line and "7 stable server(s)" in line for line in said)
    assert "the equal-load analysis (12 %): the canary takes 12 % of the requests" in said, said
    assert shares == [20, 12, 20], shares
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )


def test_a_manual_gate_holds_the_release_and_past_gate_goes_on(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    in_canary(cluster, Traffic(clock), percent=10)
    steps = [{"percent": 10, "manual_gate": True}, {"percent": 30}, {"percent": 100}]
    platform = load_platform(stepped_stack(tmp_path, steps=steps))
    verdict = serving(platform, cluster, clock, []).guard("embedder", None)
    assert verdict.action == "gated" and "--past-gate" in verdict.reason, verdict
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=10
    )


def test_too_few_requests_is_inconclusive_and_exits_5_through_the_cli(
    tmp_path: Path, cluster: FakeCluster, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_canary(cluster, Traffic(clock, canary_rps=0.2))
    path = stepped_stack(tmp_path)
    monkeypatch.setattr(
        "infra.cli.commands.serve.KubernetesServing",
        partial(KubernetesServing, clock=DriverClock(clock.monotonic, clock.sleep)),
    )
    run = run_cli("serve", "guard", "embedder", "--stack-file", str(path))
    assert run.code == 5 and "Traceback" not in run.err, run.err
    assert f"no verdict to promote on ({INCONCLUSIVE})" in run.err
    run = run_cli("serve", "status", "embedder", "--stack-file", str(path))
    # The share read without steps too (the equal-load analysis weighs it): the record names it.
    assert run.code == 0 and "guard: inconclusive at 20 %: errors could not be judged" in run.out, run.out


def test_deploy_with_guard_s_starts_the_canary_then_rolls_it_back_exit_1(
    tmp_path: Path, cluster: FakeCluster, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    traffic = Traffic(clock, canary_errors=1.0)
    in_canary(cluster, traffic)
    recorded(cluster, ServingRelease(V1))  # the canary not started yet: deploy starts it

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            return ModelVersion("embedder", 2, V2.model, "READY")

    monkeypatch.setattr("infra.cli.commands.serve.kubernetes_registry", lambda _p, url: Registry())
    monkeypatch.setattr(
        "infra.cli.commands.serve.KubernetesServing",
        partial(KubernetesServing, clock=DriverClock(clock.monotonic, clock.sleep)),
    )
    path = stepped_stack(tmp_path)
    run = run_cli(
        "serve", "deploy", "embedder@2", "--canary", "20", "--guard-s", "120", "--stack-file", str(path),
        "--registry-url", "http://r",
    )  # fmt: skip
    assert run.code == 1 and run.clean, run.err
    assert "embedder@2 is in canary with 20 %" in run.err and "rolled back:" in run.err
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(V1)


def test_a_promote_while_the_guard_runs_meets_its_lease(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    in_canary(cluster, Traffic(clock))
    platform = load_platform(stepped_stack(tmp_path))
    met: list[str] = []

    def second_command(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if "/proxy/" in request.path and not met:
            other = KubernetesServing(platform, ClusterApi(fake.client()))
            with pytest.raises(ReleaseLocked) as refused:
                other.promote("embedder")
            met.append(str(refused.value))

    cluster.before = second_command
    verdict = serving(platform, cluster, clock, []).guard("embedder", None)
    assert verdict.action == PROMOTE_READY, verdict
    assert met and "is held by" in met[0], met


def lease_taken_at_the_first_read(taken_at: list[int]) -> Callable[[Request, FakeCluster], None]:
    """Another command takes the Lease as the guard first reads a pod (noting how many requests came
    before in `taken_at`)."""

    def take_the_lease(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if "/proxy/" in request.path and not taken_at:
            taken_at.append(len(fake.requests))
            lease = json.loads(json.dumps(fake.objects[LEASE]))
            lease["spec"]["holderIdentity"] = "ci@runner pid 9"
            fake.store(LEASE, lease)

    return take_the_lease


def test_a_guard_whose_lease_another_took_stops_with_exit_5_and_changes_nothing(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """Stalled past its Lease (the API server's clock moved on), another command took it: the guard stops
    at its next look and neither rolls back nor moves the share."""
    in_canary(cluster, Traffic(clock, canary_errors=1.0))
    # The Lease is judged by the API server's clock (each answer's Date header): it moves with the test's.
    cluster.server_now = lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=clock.now)
    platform = load_platform(stepped_stack(tmp_path))
    cluster.before = lease_taken_at_the_first_read([])
    with pytest.raises(GpuPlatError, match="lost its release lock") as stopped:
        serving(platform, cluster, clock, []).guard("embedder", None)
    assert stopped.value.exit_code == 5
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )


def test_guard_without_a_canary_is_one_paragraph_exit_2(tmp_path: Path, cluster: FakeCluster) -> None:
    recorded(cluster, ServingRelease(V1))
    run = run_cli("serve", "guard", "embedder", "--stack-file", str(stepped_stack(tmp_path)))
    assert run.code == 2 and run.clean, run.err
    assert "no canary of embedder" in run.err
    assert "holderIdentity" not in cluster.objects[LEASE]["spec"]


def test_no_gateway_pod_answering_is_a_failed_look_and_three_stop_the_guard(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    in_canary(cluster, Traffic(clock))
    for name in GATEWAYS:
        cluster.refuse[("GET", f"/api/v1/namespaces/{NS}/pods/{name}:8404/proxy/metrics")] = (
            403,
            'pods "x" is forbidden: User "ci" cannot get resource "pods/proxy"',
        )
    with pytest.raises(GpuPlatError, match="refused to get pods/proxy"):
        serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)


def test_a_guard_whose_lease_another_took_stops_at_its_next_look(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """An identical canary (no change due): the guard reads the Lease at every look and stops at the first
    after another took it, instead of watching on to the end of its analysis."""
    in_canary(cluster, Traffic(clock))
    platform = load_platform(stepped_stack(tmp_path))
    taken_at: list[int] = []
    cluster.before = lease_taken_at_the_first_read(taken_at)
    with pytest.raises(GpuPlatError, match="lost its release lock") as stopped:
        serving(platform, cluster, clock, []).guard("embedder", None)
    assert stopped.value.exit_code == 5
    read_after = [r for r in cluster.requests[taken_at[0] :] if "/proxy/" in r.path]
    assert len(read_after) <= 2 + 2, read_after  # the look under way: two gateway and two model-server pods


def test_gateway_pods_the_api_server_cannot_dial_name_the_network_policy(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """The proxy dials the pod from the API server's address: a pod it cannot reach (no answer on the port,
    as a NetworkPolicy refusing the API server looks) is a failed look naming the policy and what to admit."""
    in_canary(cluster, Traffic(clock))
    cluster.pod_answers = {key: answer for key, answer in cluster.pod_answers.items() if key[1] != 8404}
    with pytest.raises(GpuPlatError, match="error trying to reach service") as stopped:
        serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert "NetworkPolicies" in stopped.value.message and "ports 8404 and 8000" in stopped.value.message


def test_a_step_whose_gateways_roll_for_a_minute_is_analysed_from_its_first_look_after(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """A new share rolls the gateway pods: new pods (new names, counters from 0) answer once the rollout,
    here a minute, is done. The step's analysis counts from its first look after it; counted from before
    the share moved, its first intervals would close at once on the minute of the rollout, with no
    requests counted in them, and end inconclusive."""
    traffic = Traffic(clock)
    in_canary(cluster, traffic, percent=10)
    rolled: list[int] = []

    def roll_the_gateways(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if request.verb == "PATCH" and request.path.endswith("/deployments/gateway") and not rolled:
            rolled.append(1)
            clock.sleep(60)
            for old in GATEWAYS:
                del fake.objects[f"/api/v1/namespaces/{NS}/pods/{old}"]
                new = f"{old}-2"
                fake.objects[f"/api/v1/namespaces/{NS}/pods/{new}"] = pod(new, "gateway")
                traffic.restarted[new] = clock.now
                fake.pod_answers[(new, 8404)] = partial(traffic.exporter, new)

    cluster.before = roll_the_gateways
    steps = [{"percent": 5}, {"percent": 30}]
    platform = load_platform(stepped_stack(tmp_path, steps=steps, inconclusive_limit=0))
    verdict = serving(platform, cluster, clock, []).guard("embedder", None)
    assert rolled and verdict.action == PROMOTE_READY, verdict


def lease_read_refused(code: int, from_read: int, reads: int) -> Callable[[Request, FakeCluster], None]:
    """The API answers `code` to `reads` GETs of the Lease from its `from_read`th (a 429 of the API server's
    priority and fairness, a 5xx of one restarting), then answers again."""
    seen: list[int] = []

    def refuse_the_lease(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if request.verb == "GET" and request.path == LEASE:
            seen.append(1)
            if from_read <= len(seen) < from_read + reads:
                fake.refuse[("GET", LEASE)] = (code, "the server is currently unable to handle the request")
            else:
                fake.refuse.pop(("GET", LEASE), None)

    return refuse_the_lease


@pytest.mark.parametrize("code", [429, 500])
@pytest.mark.parametrize("reads", [1, ATTEMPTS])
def test_a_lease_read_the_api_does_not_answer_is_not_the_end_of_the_guard(
    tmp_path: Path, cluster: FakeCluster, clock: Clock, code: int, reads: int
) -> None:
    """One look's read of the Lease refused (throttled, or the API server restarting): once, it is tried
    again (infra/k8s/api_retry.py) and the look goes on unaware; every try of the call, the Lease renewed a
    look ago is still this command's for its duration, and the guard goes on to its verdict."""
    in_canary(cluster, Traffic(clock, canary_errors=1.0))
    cluster.server_now = lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=clock.now)
    cluster.before = lease_read_refused(code, from_read=3, reads=reads)
    said: list[str] = []
    verdict = serving(load_platform(stepped_stack(tmp_path)), cluster, clock, said).guard("embedder", None)
    assert verdict.action == ROLLBACK, verdict
    unrenewed = [line for line in said if "not renewed at this look" in line]
    assert len(unrenewed) == (reads == ATTEMPTS), said
    assert all(" tries in " in line for line in unrenewed), unrenewed


def test_a_lease_the_api_does_not_answer_for_longer_than_its_duration_is_lost_exit_5(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    in_canary(cluster, Traffic(clock))
    cluster.server_now = lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=clock.now)
    cluster.before = lease_read_refused(500, from_read=3, reads=10**6)
    platform = load_platform(stepped_stack(tmp_path, intervals=20))
    with pytest.raises(GpuPlatError, match="lost its release lock") as stopped:
        serving(platform, cluster, clock, []).guard("embedder", None)
    assert stopped.value.exit_code == 5
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )


def test_the_first_look_after_a_step_failing_is_one_failed_look_not_the_end(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """The share moved and the gateways rolled; their pods do not answer the step's first look (a new pod's
    exporter not up yet, one API answer lost): a failed look of the three allowed, the step analysed from
    the first look that came."""
    in_canary(cluster, Traffic(clock), percent=10)
    rolled_at: list[float] = []
    refused: list[str] = []

    def first_look_refused(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if request.verb == "PATCH" and request.path.endswith("/deployments/gateway"):
            rolled_at.append(clock.now)
        for name in GATEWAYS:
            key = ("GET", f"/api/v1/namespaces/{NS}/pods/{name}:8404/proxy/metrics")
            if rolled_at and clock.now < rolled_at[0] + 1:
                refused.append(name)
                fake.refuse[key] = (503, "error trying to reach service: dial tcp 10.1.0.9:8404: i/o timeout")
            else:
                fake.refuse.pop(key, None)

    cluster.before = first_look_refused
    said: list[str] = []
    platform = load_platform(stepped_stack(tmp_path, steps=[{"percent": 10}, {"percent": 30}]))
    verdict = serving(platform, cluster, clock, said).guard("embedder", None)
    assert refused and verdict.action == PROMOTE_READY, verdict
    assert any("look failed (1 of 3" in line for line in said), said


def test_a_canary_pod_answering_no_metrics_text_fails_its_looks_and_stops_the_guard_exit_5(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """A bucket bound that is no number, from the first look on: three failed looks, exit 5, one paragraph
    (not a ValueError's traceback at the first)."""
    in_canary(cluster, Traffic(clock))
    cluster.pod_answers[("v2-a", 8000)] = lambda: f'{TTFT}_bucket{{le="fast"}} 1\n'
    with pytest.raises(GpuPlatError, match="3 times in a row") as stopped:
        serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert stopped.value.exit_code == 5 and "ValueError" in stopped.value.message


def test_pods_no_gateway_sends_to_are_not_counted_for_either_version(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """A retiring version's pod (its answers all fast) and a multi-node group's worker (a canary's, all
    slow) answer /metrics too: counted, the first would make the stable look faster than the canary, the
    second the canary slower; neither is, and an identical canary stays promote-ready."""
    in_canary(cluster, Traffic(clock))
    busy = Traffic(clock, canary_rps=2000.0, canary_shape=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    slow = Traffic(clock, canary_rps=2000.0, canary_shape=SLOW)
    worker = pod("v2-a-1", "model-server", V2.slug)
    worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] = "1"
    for live, answers in ((pod("v0-a", "model-server", "embedder-v0"), busy), (worker, slow)):
        name = live["metadata"]["name"]
        cluster.objects[f"/api/v1/namespaces/{NS}/pods/{name}"] = live
        cluster.pod_answers[(name, 8000)] = partial(answers.model_server, CANARY_BACKEND, name)
    verdict = serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert verdict.action == PROMOTE_READY, verdict


def test_a_lease_taken_between_the_look_and_the_rollback_stops_the_guard_before_it(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """The Lease read at the look was this command's; another command takes it while the look reads the
    pods: the rollback that look calls for reads the Lease again first and stops, changing nothing."""
    in_canary(cluster, Traffic(clock, canary_errors=1.0))
    cluster.server_now = lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=clock.now)
    proxied: list[str] = []

    def take_the_lease_at_the_second_look(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if "/proxy/" in request.path:
            proxied.append(request.path)
            if len(proxied) == 8:  # the first look's last read (the first reading had four)
                lease = json.loads(json.dumps(fake.objects[LEASE]))
                lease["spec"]["holderIdentity"] = "ci@runner pid 9"
                fake.store(LEASE, lease)

    cluster.before = take_the_lease_at_the_second_look
    with pytest.raises(GpuPlatError, match="stopped before rolling the canary back") as stopped:
        serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert stopped.value.exit_code == 5
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )


def test_a_rollback_whose_lease_read_the_api_throttles_still_rolls_the_canary_back(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """The look that calls for a rollback reads the Lease again before it; the API answers that read 429
    (its priority and fairness throttling): the Lease renewed at this look's start is still this command's
    for its duration, no other can hold it, and the failing canary is rolled back, not left at its share."""
    in_canary(cluster, Traffic(clock, canary_errors=1.0))
    cluster.server_now = lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=clock.now)
    last: list[str] = []
    throttled: list[int] = []

    def throttle_the_lease_read_after_a_look(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        fake.refuse.pop(("GET", LEASE), None)
        if request.verb == "GET" and request.path == LEASE and last and "/proxy/" in last[0]:
            throttled.append(1)
            fake.refuse[("GET", LEASE)] = (429, "Too many requests, please try again later.")
        last[:] = [request.path]

    cluster.before = throttle_the_lease_read_after_a_look
    said: list[str] = []
    verdict = serving(load_platform(stepped_stack(tmp_path)), cluster, clock, said).guard("embedder", None)
    assert throttled and verdict.action == ROLLBACK, verdict
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(V1)


def test_a_rollback_whose_lease_is_unread_past_its_duration_stops_before_it_exit_5(
    tmp_path: Path, cluster: FakeCluster, clock: Clock
) -> None:
    """The look that calls for a rollback took longer than the Lease (pods slow to answer), and the API does
    not answer the Lease's read before the rollback: another command may hold it now, and the guard stops
    before the change, exit 5, the record as it was."""
    in_canary(cluster, Traffic(clock, canary_errors=1.0))
    cluster.server_now = lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=clock.now)
    proxied: list[str] = []

    def a_slow_look_then_no_lease(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if "/proxy/" in request.path:
            proxied.append(request.path)
            if len(proxied) == 8:  # the first look's last read (the first reading had four)
                clock.sleep(61)
                fake.refuse[("GET", LEASE)] = (503, "the server is currently unable to handle the request")

    cluster.before = a_slow_look_then_no_lease
    with pytest.raises(GpuPlatError, match="could not read its release lock") as stopped:
        serving(load_platform(stepped_stack(tmp_path)), cluster, clock, []).guard("embedder", None)
    assert stopped.value.exit_code == 5 and "before rolling the canary back" in stopped.value.message
    assert read_record(ClusterApi(cluster.client()), NS)[0] == ServingRelease(
        V1, canary=V2, canary_percent=20
    )
