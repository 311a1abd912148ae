"""The retry policy of every call to the Kubernetes API (infra/k8s/api_retry.py), on both of its clients:
the CLI's ClusterApi through the official client on the API fake (tests/k8s_api_fake.py), and the guard
Job's KubeHttp over real HTTP on the loopback (tests/unit/test_guard_job.py ApiBridge). No test sleeps:
the waits are counted (tests/conftest.py api_retries_sleep_not), the jitter drawn at its middle (0.75 of
the backoff).

Not modelled: API Priority and Fairness itself (the 429s and their Retry-After are the test's), an HTTP/2
connection lost, a load balancer in front of the API server."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from urllib3.exceptions import SSLError

from infra.k8s.api_refs import ClusterError, Conflict, ObjectRef, Unavailable
from infra.k8s.api_retry import LEASE_MARGIN_S, Pace, Retrier, retry_after_s, unanswered
from infra.k8s.release_lock import ReleaseLock, ReleaseLocked
from infra.k8s.serving_apply import RELEASE_RECORD, ClusterApi, record_manifest
from infra.k8s.serving_versions import ServingRelease
from infra.serving.guard_job import FIELD_MANAGER
from infra.serving.kube_http import TIMEOUT_S, KubeHttp
from tests.conftest import CountedPace
from tests.k8s_api_fake import FakeCluster, Request, lost_connection, rolls_out
from tests.unit.test_guard_job import ApiBridge, _serve
from tests.unit.test_hostile_input import run_cli
from tests.unit.test_serve_on_kubernetes import CONFIGMAPS, LEASE, NS, V1, V2, cluster, recorded

__all__ = ["cluster"]  # the CLI's fixture: `connect` answered by the fake

LEASES = LEASE.rpartition("/")[0]
RECORD = f"{CONFIGMAPS}/{RELEASE_RECORD}"
RECORD_REF = ObjectRef("v1", "ConfigMap", RELEASE_RECORD, NS)
THROTTLED = "Too many requests, please try again later."


def refused(verb: str, path: str, code: int, times: int) -> Callable[[Request, FakeCluster], None]:
    """`verb path` answered `code` its first `times` times, then as the fake answers it."""
    seen: list[int] = []

    def refuse(request: Request, fake: FakeCluster) -> None:
        rolls_out(request, fake)
        if (request.verb, request.path) == (verb, path):
            seen.append(1)
            if len(seen) <= times:
                fake.refuse[(verb, path)] = (code, THROTTLED if code == 429 else "etcdserver: leader changed")
            else:
                fake.refuse.pop((verb, path), None)

    return refuse


def tried(cluster: FakeCluster, verb: str, path: str) -> int:
    return sum(1 for r in cluster.requests if (r.verb, r.path) == (verb, path))


# ------------------------------------------------------------------- the CLI's client (official client)


def test_a_429_is_tried_again_after_its_retry_after(api_retries_sleep_not: CountedPace) -> None:
    cluster = FakeCluster(refuse_headers={"Retry-After": "3"})
    recorded(cluster, ServingRelease(V1))
    cluster.before = refused("GET", RECORD, 429, times=2)
    live = ClusterApi(cluster.client()).get(RECORD_REF)
    assert live is not None and live["metadata"]["name"] == RELEASE_RECORD
    assert tried(cluster, "GET", RECORD) == 3
    # Retry-After (3 s) is longer than the backoff (0.375 s, 0.75 s): it is what is waited.
    assert api_retries_sleep_not.waits == [3.0, 3.0]


def test_a_503_without_retry_after_backs_off_then_the_apply_goes_through(
    api_retries_sleep_not: CountedPace,
) -> None:
    cluster = FakeCluster(before=refused("PATCH", RECORD, 503, times=3))
    answer = ClusterApi(cluster.client()).apply(record_manifest(NS, ServingRelease(V1), None))
    assert answer["metadata"]["resourceVersion"] == cluster.objects[RECORD]["metadata"]["resourceVersion"]
    assert api_retries_sleep_not.waits == [0.375, 0.75, 1.5]


def test_a_connection_reset_before_a_read_is_answered_is_tried_again(
    api_retries_sleep_not: CountedPace,
) -> None:
    cluster = FakeCluster()
    recorded(cluster, ServingRelease(V1))
    resets: list[int] = []

    def reset_once(request: Request, _fake: FakeCluster) -> None:
        if not resets:
            resets.append(1)
            raise lost_connection()

    cluster.before = reset_once
    assert ClusterApi(cluster.client()).get(RECORD_REF) is not None
    assert tried(cluster, "GET", RECORD) == 2 and api_retries_sleep_not.waits == [0.375]


def test_a_lease_create_whose_answer_was_lost_is_read_back_as_this_commands() -> None:
    """The create went through, its answer was lost (the connection reset): the second try meets 409
    AlreadyExists, the Lease read back holds this command's holder and times, and it is this command's."""
    cluster = FakeCluster(lose_answer={("POST", LEASES)})
    lock = ReleaseLock(ClusterApi(cluster.client()), NS, "embedder", "ci@runner pid 7 ab12")
    lock.acquire()
    assert tried(cluster, "POST", LEASES) == 2
    assert cluster.objects[LEASE]["spec"]["holderIdentity"] == "ci@runner pid 7 ab12"
    lock.renew(force=True)  # the resourceVersion it kept is the one the server has
    assert cluster.objects[LEASE]["spec"]["holderIdentity"] == "ci@runner pid 7 ab12"


def test_a_lease_create_lost_while_another_took_it_is_refused_naming_the_other() -> None:
    """The first try was not answered, and another command created the Lease meanwhile: the 409 of the
    second try is read back, the Lease is not what this command sent, and it is refused as held."""
    cluster = FakeCluster()
    other = ReleaseLock(ClusterApi(FakeCluster().client()), NS, "embedder", "ops@laptop pid 9 cd34")

    def another_takes_it(request: Request, fake: FakeCluster) -> None:
        if (request.verb, request.path) == ("POST", LEASES) and LEASE not in fake.objects:
            fake.store(LEASE, other._manifest(datetime.now(UTC), 0))
            raise lost_connection()

    cluster.before = another_takes_it
    with pytest.raises(ReleaseLocked, match="held by ops@laptop pid 9 cd34"):
        ReleaseLock(ClusterApi(cluster.client()), NS, "embedder", "ci@runner pid 7 ab12").acquire()


@pytest.mark.parametrize("another_writes", [False, True])
def test_a_lease_update_whose_answer_was_lost_is_not_retried_past_a_conflict(another_writes: bool) -> None:
    """The renewal (a PUT with the resourceVersion read) went through unanswered: its second try meets 409
    Conflict, and the Lease read back is this command's renewal. Where another command wrote the Lease
    between the two tries, the conflict stands: the release is that command's."""
    cluster = FakeCluster()
    api = ClusterApi(cluster.client())
    lock = ReleaseLock(api, NS, "embedder", "ci@runner pid 7 ab12")
    lock.acquire()
    cluster.lose_answer.add(("PUT", LEASE))
    taken = ReleaseLock(ClusterApi(FakeCluster().client()), NS, "embedder", "ops@laptop pid 9 cd34")

    def another_takes_it(request: Request, fake: FakeCluster) -> None:
        if another_writes and request.verb == "PUT" and ("PUT", LEASE) not in fake.lose_answer:
            fake.store(LEASE, taken._manifest(datetime.now(UTC), 1))

    cluster.before = another_takes_it
    if another_writes:
        with pytest.raises(ReleaseLocked, match="held by ops@laptop pid 9 cd34"):
            lock.renew(force=True)
    else:
        lock.renew(force=True)
        lock.release()
        assert "holderIdentity" not in cluster.objects[LEASE]["spec"]
    assert tried(cluster, "PUT", LEASE) >= 2


def test_a_409_after_only_429s_is_the_conflict_it_says() -> None:
    """A 429 was refused before any handler ran (API Priority and Fairness): the 409 of the next try is
    another client's object even where it reads as what this one sent, and no read-back is made."""
    cluster = FakeCluster()
    other = record_manifest(NS, ServingRelease(V1), None)

    def throttled_while_another_creates(request: Request, fake: FakeCluster) -> None:
        if request.verb == "POST" and RECORD not in fake.objects:
            fake.store(RECORD, other)
            fake.refuse[("POST", CONFIGMAPS)] = (429, THROTTLED)
        else:
            fake.refuse.pop(("POST", CONFIGMAPS), None)

    cluster.before = throttled_while_another_creates
    with pytest.raises(Conflict):
        ClusterApi(cluster.client()).create(other)
    assert tried(cluster, "POST", CONFIGMAPS) == 2 and tried(cluster, "GET", RECORD) == 0


def test_a_refusal_that_does_not_pass_is_not_tried_again(api_retries_sleep_not: CountedPace) -> None:
    cluster = FakeCluster(refuse={("GET", RECORD): (403, 'User "ci" cannot get resource "configmaps"')})
    with pytest.raises(ClusterError, match="HTTP 403"):
        ClusterApi(cluster.client()).get(RECORD_REF)
    assert tried(cluster, "GET", RECORD) == 1
    cluster = FakeCluster(unreachable=SSLError("certificate verify failed"))
    with pytest.raises(ClusterError, match=r"reached over TLS \(SSLError certificate verify") as failed:
        ClusterApi(cluster.client()).get(RECORD_REF)
    assert not isinstance(failed.value, Unavailable) and api_retries_sleep_not.waits == []


def test_a_retry_after_longer_than_the_policy_waits_stops_at_once() -> None:
    cluster = FakeCluster(refuse={("GET", RECORD): (429, THROTTLED)}, refuse_headers={"Retry-After": "60"})
    with pytest.raises(Unavailable, match=r"1 try in 0 s; it asked for 60 s before the next, over 10"):
        ClusterApi(cluster.client()).get(RECORD_REF)


def test_retries_stop_before_the_lease_the_command_holds_expires() -> None:
    """A call refused 503 (Retry-After 3) while the Lease this command renewed expires in 9 s: one retry
    fits (6 s left after it, more than the 5 s margin), the next would not: the call stops and says so."""
    pace = CountedPace()
    left = [9.0]

    def sleep(seconds: float) -> None:
        pace.sleep(seconds)
        left[0] -= seconds

    cluster = FakeCluster(refuse={("GET", RECORD): (503, "the server is shutting down")})
    cluster.refuse_headers = {"Retry-After": "3"}
    retry = Retrier(Pace(sleep, pace.monotonic, pace.draw), bound=lambda: left[0])
    with pytest.raises(Unavailable, match="expires in 6 s, before the next try") as stopped:
        ClusterApi(cluster.client(), retry).get(RECORD_REF)
    assert pace.waits == [3.0] and left[0] - 3.0 < LEASE_MARGIN_S
    assert "stopped rather than hold the release past its Lease" in stopped.value.message


def test_a_command_the_api_keeps_refusing_ends_with_one_paragraph(cluster: FakeCluster) -> None:
    recorded(cluster, ServingRelease(V1, canary=V2, canary_percent=20))
    cluster.refuse[("GET", RECORD)] = (503, "etcdserver: request timed out")
    run = run_cli("serve", "status", "embedder", "--stack", "aws-k8s")
    assert run.code == 4 and run.clean, run.err
    assert "answered HTTP 503" in run.err and "tries in" in run.err and "pass the 30 s" in run.err


# ------------------------------------------------------------------ the guard Job's client (stdlib only)


@pytest.fixture
def served() -> Iterator[tuple[FakeCluster, ApiBridge, list[float]]]:
    now = [0.0]
    fake = FakeCluster(server_now=lambda: datetime(2026, 12, 7, tzinfo=UTC) + timedelta(seconds=now[0]))
    bridge = ApiBridge(fake)
    _serve(bridge)
    yield fake, bridge, now
    bridge.shutdown()
    bridge.server_close()


def guard_client(bridge: ApiBridge, tmp_path: Path) -> KubeHttp:
    token = tmp_path / "token"
    token.write_text("test-token")
    return KubeHttp(f"http://127.0.0.1:{bridge.server_address[1]}", token, None, FIELD_MANAGER)


def test_the_guards_client_waits_out_a_429_and_reads_back_a_lost_create(
    served: tuple[FakeCluster, ApiBridge, list[float]], tmp_path: Path, api_retries_sleep_not: CountedPace
) -> None:
    """Over real HTTP: the Lease's read throttled once (Retry-After 2), its create carried out and the
    connection then closed unanswered (the client sees RemoteDisconnected): the guard holds the Lease."""
    fake, bridge, _ = served
    fake.refuse_headers = {"Retry-After": "2"}
    fake.before = refused("GET", LEASE, 429, times=1)
    fake.lose_answer.add(("POST", LEASES))
    api = guard_client(bridge, tmp_path)
    lock = ReleaseLock(api, NS, "embedder", "job/gpuplat-serve-guard-embedder-1a2b3c", now=api.server_now)
    lock.acquire()
    assert fake.objects[LEASE]["spec"]["holderIdentity"] == "job/gpuplat-serve-guard-embedder-1a2b3c"
    assert tried(fake, "POST", LEASES) == 2 and api_retries_sleep_not.waits == [2.0, 0.375]


def test_the_guard_stops_retrying_before_its_lease_expires(
    served: tuple[FakeCluster, ApiBridge, list[float]], tmp_path: Path
) -> None:
    """The guard renewed its Lease at 0 s; at 50 s (the API server's clock) its renewal is answered 503 with
    Retry-After 3: one retry, then it stops with 7 s of the Lease left rather than retry past it, and the
    guard's look (release_lock.lost_at_look) judges the Lease by its last renewal."""
    fake, bridge, now = served
    api = guard_client(bridge, tmp_path)

    def sleep(seconds: float) -> None:
        now[0] += seconds

    api.retry = Retrier(Pace(sleep, lambda: now[0], lambda: 0.5))
    lock = ReleaseLock(api, NS, "embedder", "job/gpuplat-serve-guard-embedder-1a2b3c", now=api.server_now)
    api.retry.bound = lock.seconds_left  # as guard_job.run wires it
    lock.acquire()
    now[0] = 50.0
    fake.refuse[("GET", LEASE)] = (503, "etcdserver: leader changed")
    fake.refuse_headers = {"Retry-After": "3"}
    with pytest.raises(Unavailable, match="expires in 7 s") as stopped:
        lock.renew(force=True)
    assert tried(fake, "GET", LEASE) == 3  # the acquire's read, then two tries
    assert json.dumps(stopped.value.message).count("\\n") == 0 and lock.unexpired()


# --------------------------------------------------------- a try's own length, not only the wait before it


def test_a_retry_is_not_started_where_the_try_could_outlast_the_lease(
    served: tuple[FakeCluster, ApiBridge, list[float]], tmp_path: Path
) -> None:
    """Each try of the guard's client may take up to its timeout (kube_http.TIMEOUT_S) before it is given
    up: a retry whose wait leaves more than the margin but less than that timeout could still be running,
    or be carried out by the API server, after the Lease expired and another command took the release.
    Here each try hangs until its timeout: no try may be started that could end past LEASE_MARGIN_S before
    the Lease's expiry."""
    _, bridge, now = served
    api = guard_client(bridge, tmp_path)
    expiry = 25.0
    api.retry.pace = Pace(lambda s: now.__setitem__(0, now[0] + s), lambda: now[0], lambda: 0.5)
    api.retry.bound = lambda: expiry - now[0]
    started: list[float] = []

    def hangs() -> dict[str, object]:
        started.append(now[0])
        now[0] += TIMEOUT_S
        raise Unavailable("the Kubernetes API cannot be reached (TimeoutError: timed out)")

    with pytest.raises(Unavailable) as stopped:
        api.retry.call("GET Lease", hangs)
    assert all(at + TIMEOUT_S <= expiry - LEASE_MARGIN_S for at in started[1:]), started
    assert "expires in 10 s" in stopped.value.message and started == [0.0]


def test_every_call_of_the_clis_client_is_given_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without one, urllib3 waits on a socket for ever (a connection to an API server that no longer
    answers, a black-holed route): no TimeoutError comes for the retry policy to see, and the command holds
    its Lease's release unguarded as long as it hangs."""
    cluster = FakeCluster()
    recorded(cluster, ServingRelease(V1))
    timeouts: list[object] = []
    answer = cluster.request

    def timed(method: str, url: str, **kwargs: object) -> object:
        timeouts.append(kwargs.get("timeout"))
        return answer(method, url, **kwargs)

    monkeypatch.setattr(cluster, "request", timed)
    api = ClusterApi(cluster.client())
    api.get(RECORD_REF)
    api.apply(record_manifest(NS, ServingRelease(V1), None))
    assert timeouts and all(t is not None for t in timeouts), timeouts
    assert api.retry.try_s >= max(getattr(t, "total", 0) or 0 for t in timeouts)


def test_a_renewal_read_back_is_told_apart_to_the_microsecond() -> None:
    """Two pods of one guard Job (a pod replaced while the old one still runs) renew under one holder. This
    command's renewal was answered 503 and not carried out; the other wrote the Lease in the same second,
    a few microseconds apart. The read-back after the 409 must not take that Lease for this renewal."""
    cluster = FakeCluster()
    lock = ReleaseLock(ClusterApi(cluster.client()), NS, "embedder", "job/gpuplat-serve-guard-embedder-1a2b")
    lock.acquire()
    seen: list[int] = []

    def the_other_pod_renews(request: Request, fake: FakeCluster) -> None:
        if (request.verb, request.path) != ("PUT", LEASE):
            return
        seen.append(1)
        if len(seen) == 1:
            sent = json.loads(json.dumps(request.body))
            renewed = sent["spec"]["renewTime"]
            micros = (int(renewed[20:26]) + 7) % 1_000_000
            sent["spec"]["renewTime"] = f"{renewed[:20]}{micros:06d}Z"
            del sent["metadata"]["resourceVersion"]
            fake.store(LEASE, sent)
            fake.refuse[("PUT", LEASE)] = (503, "etcdserver: leader changed")
        else:
            fake.refuse.pop(("PUT", LEASE), None)

    cluster.before = the_other_pod_renews
    with pytest.raises(ReleaseLocked):
        lock.renew(force=True)
    assert tried(cluster, "PUT", LEASE) == 2


# ------------------------------------------------------- the policy's numbers, each pinned (mutants survived)


def _refusing(status: int | None, retry_after: float | None = None) -> Callable[[], dict[str, object]]:
    def attempt() -> dict[str, object]:
        raise Unavailable("the Kubernetes API answered", status, retry_after)

    return attempt


def test_the_backoff_doubles_to_its_cap_over_eleven_tries_at_most() -> None:
    """client-go's maxRetries 10 (request.go NewRequest): 11 tries, the waits (drawn at 0.75 of the
    backoff) doubling from 0.5 s to the 8 s cap; the time bound set out of the way."""
    pace = CountedPace()
    tries: list[int] = []
    attempt = _refusing(503)

    def counted() -> dict[str, object]:
        tries.append(1)
        return attempt()

    retry = Retrier(Pace(pace.sleep, pace.monotonic, pace.draw), total_s=1000.0)
    with pytest.raises(Unavailable, match="no try is left"):
        retry.call("GET Lease", counted)
    assert len(tries) == 11
    assert pace.waits == [0.375, 0.75, 1.5, 3.0] + [6.0] * 6


def test_the_time_bound_counts_the_wait_before_the_next_try() -> None:
    """30 s in all: after 7 waits (23.6 s) one more of 6 s fits (29.6 s), the next would pass 30 s."""
    pace = CountedPace()
    retry = Retrier(Pace(pace.sleep, pace.monotonic, pace.draw))
    with pytest.raises(Unavailable, match=r"9 tries in 30 s; the next, after 6.0 s more, would pass the 30"):
        retry.call("GET Lease", _refusing(503))
    assert sum(pace.waits) == pytest.approx(29.625)


def test_a_retry_after_shorter_than_the_backoff_waits_the_backoff() -> None:
    """withRetry.Before (with_retry.go): the longer of Retry-After and the backoff."""
    pace = CountedPace()
    retry = Retrier(Pace(pace.sleep, pace.monotonic, pace.draw), attempts=5)
    with pytest.raises(Unavailable):
        retry.call("GET Lease", _refusing(429, 1.0))
    assert pace.waits == [1.0, 1.0, 1.5, 3.0]


@pytest.mark.parametrize("header", ["1.5", "Wed, 21 Oct 2026 07:28:00 GMT", "", None])
def test_a_retry_after_not_in_whole_seconds_is_not_read(header: str | None) -> None:
    """request.go retryAfterSeconds: strconv.Atoi, nothing else."""
    assert retry_after_s(header) is None
    assert retry_after_s(" 3 ") == 3.0


def test_a_tls_failure_or_a_name_that_does_not_resolve_is_not_retried_by_the_guards_client() -> None:
    """Both are OSErrors (urllib wraps them in URLError): the stdlib path must not take them for a
    connection that may heal."""
    assert not unanswered(ssl.SSLCertVerificationError(1, "certificate verify failed"))
    assert not unanswered(socket.gaierror(-2, "Name or service not known"))
    assert unanswered(ConnectionResetError(104, "Connection reset by peer"))
    assert unanswered(TimeoutError("timed out"))
