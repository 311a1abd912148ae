"""Plays the steps of a release (infra/k8s/serving_steps.py) against a cluster's API: each step's objects
by server-side apply, then what the step names waited for, then the workloads it removes deleted; the
release itself kept in a ConfigMap, and one release at a time per model under a Lease.

Kubernetes facts relied on (kubernetes/website content/en/docs/reference/using-api/server-side-apply.md
and api-concepts.md, kubernetes/kubernetes at v1.34, the stacks' version):
- An apply is a PATCH with the content type `application/apply-patch+yaml` (JSON is valid YAML) and a
  fieldManager; `force=true` takes the fields another manager owns ("Using Server-Side Apply in a
  controller": always force on objects you own and manage). The gateways' ConfigMap and every workload
  are gpuplat's, and a retiring version's `spec.replicas` (KEDA's while it was stable) must change hands.
- "Transferring ownership": a field dropped from an apply that no other manager owns is reset to its
  default (a Deployment's replicas to 1); a private manager applying only that field first keeps it
  until the autoscaler writes it. That is how the stable workload's count goes back to KEDA.
- An update (PUT) that carries a stale metadata.resourceVersion is answered 409 Conflict; a create of a
  name that exists is answered 409 AlreadyExists. The Lease is taken only through those two.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from functools import partial
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import (
    HTTPError,
    LocationValueError,
    MaxRetryError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
)
from urllib3.exceptions import SSLError as Urllib3SSLError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from infra.k8s.api_refs import ClusterError as ClusterError
from infra.k8s.api_refs import Conflict as _Conflict
from infra.k8s.api_refs import NotFound as _NotFound
from infra.k8s.api_refs import ObjectRef as ObjectRef
from infra.k8s.api_refs import Unavailable, refusal
from infra.k8s.api_retry import Retrier, retry_after_s, unanswered
from infra.k8s.facts import ClusterFacts
from infra.k8s.objects import LABEL_COMPONENT, serving_namespace
from infra.k8s.release_lock import LEASE_DURATION_S as LEASE_DURATION_S
from infra.k8s.release_lock import ReleaseLock as ReleaseLock
from infra.k8s.release_lock import ReleaseLocked as ReleaseLocked
from infra.k8s.release_lock import default_holder as default_holder
from infra.k8s.rollout import gateways_wait
from infra.k8s.rollout import rollout_done as rollout_done
from infra.k8s.serving import (
    GATEWAY,
    LABEL_MODEL_VERSION,
    LWS_API,
    MODEL_ENV,
    MODEL_SERVER,
    serving_objects,
    version_track_names,
)
from infra.k8s.serving_steps import ReleaseStep
from infra.k8s.serving_versions import ServedVersion, ServingRelease
from infra.platform.resolve import ResolvedPlatform

FIELD_MANAGER = "gpuplat-serve"
# The private manager of "Transferring ownership": it owns only the stable workload's spec.replicas, and
# the API server drops it by itself once KEDA's HorizontalPodAutoscaler writes the field.
HANDOVER_MANAGER = "gpuplat-serve-handover-to-keda"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
# The release record: one per stack (its gateways and KEDA's target are one), in the serving namespace.
RELEASE_RECORD = "gpuplat-serve-release"
RELEASE_RECORD_KEY = "release"
MODEL_URI_KEY = "model-uri"
# What `gpuplat up` owns and no step changes: a release applies none of them (nor needs the right to).
_NOT_A_RELEASES = frozenset({"Namespace", "PersistentVolume", "PersistentVolumeClaim", "ServiceAccount"})
POLL_S = 2.0
PROXY_TIMEOUT_S = 15.0
API_TIMEOUT_S = 15.0
"""the longest one call to the API itself is waited for (urllib3 waits for ever without one): what the
retries see as a call not answered, and what bounds a retry near the Lease's expiry (api_retry try_s)"""

_VERBS = {"GET": "get", "PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}


class ClusterApi:
    """The few calls a release makes, through the official client's ApiClient (its configuration: a
    kubeconfig or the in-cluster account), each under the retry policy of infra/k8s/api_retry.py (`retry`,
    bounded by the Lease the command holds once it holds one), each failure turned into one paragraph."""

    def __init__(self, client: ApiClient, retry: Retrier | None = None) -> None:
        self.client = client
        self._server_clock: tuple[datetime, float] | None = None
        self.retry = retry or Retrier(try_s=API_TIMEOUT_S)

    def server_now(self) -> datetime:
        """The API server's time: the Date header of its last answer (Go's net/http server writes one on
        every response it has none for: src/net/http/server.go, chunkWriter.writeHeader; an HTTP-date,
        RFC 9110 5.6.7, to the second) plus the time passed here since. A Lease's renewTime
        is written and judged by that clock, so that commands whose own clocks disagree (a laptop minutes
        off) agree on when it expires; this machine's clock before any answer came."""
        if self._server_clock is None:
            return datetime.now(UTC)
        said, at = self._server_clock
        return said + timedelta(seconds=time.monotonic() - at)

    def _note_server_clock(self, headers: Mapping[str, str] | None) -> None:
        date = next((v for k, v in (headers or {}).items() if k.lower() == "date"), None)
        with contextlib.suppress(TypeError, ValueError):
            if date:
                self._server_clock = (parsedate_to_datetime(date).astimezone(UTC), time.monotonic())

    @property
    def server(self) -> str:
        return str(self.client.configuration.host)

    def _call(
        self,
        verb: str,
        path: str,
        ref: ObjectRef,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One call under the retry policy (api_retry.Retrier.call: a write's object read back for a 409
        after a try that was not answered)."""

        def once() -> dict[str, Any]:
            answer = self._answer(verb, path, ref, query=query, body=body, content_type=content_type)
            # An answer's headers: the client keeps its last answer (kubernetes/client/api_client.py
            # __call_api, last_response), not a refusal.
            response = getattr(self.client, "last_response", None)
            self._note_server_clock(response.getheaders() if response is not None else None)
            return answer if isinstance(answer, dict) else {}

        return self.retry.call(f"{verb} {ref}", once, verb=verb, body=body, read_back=lambda: self.get(ref))

    def _answer(
        self,
        verb: str,
        path: str,
        ref: ObjectRef,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        subresource: str = "",
    ) -> Any:
        """The client's answer: a JSON object, or (a subresource: a pod's proxied answer) its urllib3
        response unread (api_client.py __call_api returns it as is with _preload_content=False)."""
        raw = bool(subresource)
        try:
            return self.client.call_api(
                path,
                verb,
                query_params=query or [],
                header_params={
                    "Content-Type": content_type,
                    # The proxied server reads Accept: Prometheus' text format, not OpenMetrics nor JSON.
                    "Accept": "text/plain" if raw else "application/json",
                },
                body=body,
                response_types_map={} if raw else {200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=not raw,
                # A proxied server that hangs must not hold the guard past its look (and the Lease's renewal).
                _request_timeout=PROXY_TIMEOUT_S if raw else API_TIMEOUT_S,
            )
        except AttributeError as error:
            # A TLS failure: the client's transport raises an ApiException with no body (kubernetes 36.0.3,
            # client/rest.py RESTClientObject.request: urllib3's SSLError as status 0), whose decoding then
            # fails in ApiClient.__call_api (`e.body.decode`). That ApiException is what happened.
            if not isinstance(error.__context__, ApiException):
                raise
            said = " ".join(str(error.__context__.reason or "").split())
            raise ClusterError(
                f"the Kubernetes API at {self.server} cannot be reached over TLS ({said}). Check the "
                "certificate authority the kubeconfig names for the cluster (certificate-authority-data) "
                "and that the address is the API server's"
            ) from None
        except ApiException as error:
            # A refusal's headers come with it (kubernetes/client/exceptions.py, ApiException.headers): the
            # first acquire of a Lease reads a 404 before it writes the Lease's times.
            self._note_server_clock(error.headers)
            raise _refused(error, verb, ref, self.server, subresource) from None
        except (HTTPError, OSError) as error:
            said = (
                f"the Kubernetes API at {self.server} cannot be reached ({type(error).__name__}: {error}). "
                "Check the kubeconfig gpuplat read (KUBECONFIG, else ~/.kube/config; `aws eks "
                "update-kubeconfig` on an EKS stack) and that this machine has a route to the API server"
            )
            raise (Unavailable(said) if _unanswered(error) else ClusterError(said)) from None

    def pod_text(self, namespace: str, pod: str, port: int, path: str) -> str:
        """What a pod's server answers at `path` on `port`, through the API server's proxy (GET
        /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH, the `proxy` subresource of pods): this machine needs
        a route to the API server only. The API server authorizes it as verb `get` on `pods/proxy`: the verb
        of a path that is not a special verb's (`/api/v1/proxy/...`, `/watch/...`) is the HTTP method's, and
        the part after the name is the subresource (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/
        endpoints/request/requestinfo.go at v1.34.0, NewRequestInfo: specialVerbs "proxy", "watch";
        Parts[2] the subresource)."""
        ref = ObjectRef("v1", "Pod", pod, namespace)
        # One try: a pod that does not answer is left out of this look, and the look is the guard's to
        # retry (the next one, LOOK_S later), not the API client's.
        proxied = f"{ObjectRef('v1', 'Pod', f'{pod}:{port}', namespace).path()}/proxy/{path.lstrip('/')}"
        response = self._answer("GET", proxied, ref, subresource="proxy")
        self._note_server_clock(response.getheaders())
        data = response.data
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")

    def apply(
        self, manifest: Mapping[str, Any], *, manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        """The object as applied (the server's answer: its new resourceVersion)."""
        ref = ObjectRef.of(manifest)
        query = [("fieldManager", manager)] + ([("force", "true")] if force else [])
        return self._call(
            "PATCH", ref.path(), ref, query=query, body=dict(manifest), content_type=APPLY_CONTENT_TYPE
        )

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            return self._call("GET", ref.path(), ref)
        except _NotFound:
            return None

    def list(self, ref: ObjectRef, label_selector: str) -> list[dict[str, Any]]:
        answer = self._call("GET", ref.path(collection=True), ref, query=[("labelSelector", label_selector)])
        items = answer.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(manifest)
        return self._call(
            "POST",
            ref.path(collection=True),
            ref,
            query=[("fieldManager", FIELD_MANAGER)],
            body=dict(manifest),
        )

    def update(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """A PUT: the manifest carries the resourceVersion it was read at; a stale one is a 409."""
        ref = ObjectRef.of(manifest)
        return self._call(
            "PUT", ref.path(), ref, query=[("fieldManager", FIELD_MANAGER)], body=dict(manifest)
        )

    def delete(self, ref: ObjectRef) -> bool:
        """False when it was gone already (a second run after a kill)."""
        try:
            self._call("DELETE", ref.path(), ref, body={"propagationPolicy": "Background"})
        except _NotFound:
            return False
        return True


def _refused(
    error: ApiException, verb: str, ref: ObjectRef, server: str, subresource: str = ""
) -> ClusterError:
    said = ""
    try:
        said = str(json.loads(error.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        said = str(error.body or "")
    said = said or str(error.reason or "")
    forbidden = (
        f"the Kubernetes API at {server} refused to {_VERBS.get(verb, verb.lower())} "
        f"{ref.resource}{'/' + subresource if subresource else ''} "
        f"({ref}): HTTP {error.status}, {said}. The identity in the kubeconfig needs that verb on that "
        "resource in the serving namespace (docs/serving.md, On Kubernetes)"
    )
    retry_after = retry_after_s(
        next((v for k, v in (error.headers or {}).items() if k.lower() == "retry-after"), None)
    )
    return refusal(int(error.status or 0), said, verb, ref, server, forbidden, retry_after)


def _unanswered(error: BaseException) -> bool:
    """Whether the official client's transport (urllib3 2.x, its own retries off: infra/serving/
    on_kubernetes.py connect) failed in a way that may pass on a second try (api_retry.unanswered):
    a connection reset or cut short (ProtocolError, wrapping the socket's error), refused (NewConnectionError)
    or timed out; not a TLS failure nor a name that does not resolve."""
    if isinstance(error, MaxRetryError) and error.reason is not None:
        error = error.reason
    if isinstance(error, Urllib3SSLError | NameResolutionError | LocationValueError):
        return False
    if isinstance(error, ProtocolError | NewConnectionError | Urllib3Timeout):
        return True
    return unanswered(error)


def _version(data: Any) -> ServedVersion | None:
    return ServedVersion(data["reference"], data["model"]) if isinstance(data, dict) else None


def release_to_json(release: ServingRelease) -> str:
    return json.dumps(asdict(release), sort_keys=True)


def release_from_json(text: str) -> ServingRelease:
    data = json.loads(text)
    stable = _version(data["stable"])
    if stable is None:
        raise ValueError("a release without a stable version")
    return ServingRelease(
        stable,
        stable_replicas=data.get("stable_replicas"),
        canary=_version(data.get("canary")),
        canary_percent=int(data.get("canary_percent") or 0),
        canary_replicas=int(data.get("canary_replicas") or 1),
        retiring=_version(data.get("retiring")),
        retiring_replicas=int(data.get("retiring_replicas") or 0),
        stack_model=data.get("stack_model") or "gone",
    )


def record_manifest(namespace: str, release: ServingRelease, model_uri: str | None) -> dict[str, Any]:
    """`model_uri`: where the stack's own files are read (facts.model_uri: on EKS the purpose's generated
    bucket name in place), kept so that every later step renders the stable version as the first did."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": RELEASE_RECORD,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
        },
        "data": {
            RELEASE_RECORD_KEY: release_to_json(release),
            **({MODEL_URI_KEY: model_uri} if model_uri else {}),
        },
    }


def read_record(api: ClusterApi, namespace: str) -> tuple[ServingRelease | None, str | None]:
    """The release the record holds (None before the first: the stack's own model serves) and the URI of
    the stack's own files it keeps."""
    return record_of(api.get(ObjectRef("v1", "ConfigMap", RELEASE_RECORD, namespace)))


def record_of(live: Mapping[str, Any] | None) -> tuple[ServingRelease | None, str | None]:
    data = (live or {}).get("data") or {}
    text = data.get(RELEASE_RECORD_KEY)
    return (release_from_json(text) if text else None), data.get(MODEL_URI_KEY)


# ------------------------------------------------------------------------------------------ the waits


def workload_kind(platform: ResolvedPlatform) -> tuple[str, str]:
    """The apiVersion and kind of each version's model servers: a LeaderWorkerSet where a replica spans
    nodes (infra/k8s/serving.py _model_server)."""
    layout = platform.serving_layout
    if layout is not None and layout.nodes > 1:
        return LWS_API, "LeaderWorkerSet"
    return "apps/v1", "Deployment"


@dataclass
class Clock:
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


# ----------------------------------------------------------------------------------------- the driver


@dataclass
class ReleaseDriver:
    """Plays a list of ReleaseSteps of one model on one stack's cluster, under its lock."""

    api: ClusterApi
    platform: ResolvedPlatform
    facts: ClusterFacts
    model: str
    lock: ReleaseLock
    timeout_s: float = 1800.0
    clock: Clock = field(default_factory=Clock)
    say: Callable[[str], None] = lambda _: None
    record_version: str | None = None
    """the release record's resourceVersion as this command last read or wrote it: its next write is
    guarded by it (None: no record read yet)"""

    @property
    def namespace(self) -> str:
        return serving_namespace(self.platform)

    @property
    def workload_kind(self) -> tuple[str, str]:
        return workload_kind(self.platform)

    def workload_ref(self, name: str) -> ObjectRef:
        return ObjectRef(*self.workload_kind, name, self.namespace)

    def current(self) -> ServingRelease | None:
        live = self.api.get(ObjectRef("v1", "ConfigMap", RELEASE_RECORD, self.namespace))
        self.record_version = (live or {}).get("metadata", {}).get("resourceVersion")
        return record_of(live)[0]

    def _apply_release(self, release: ServingRelease) -> None:
        for manifest in serving_objects(self.platform, self.facts, self._keeping_keda_counts(release)):
            if manifest["kind"] not in _NOT_A_RELEASES:
                self.api.apply(manifest)

    def _live_count(self, name: str) -> tuple[dict[str, Any] | None, int | None]:
        live = self.api.get(self.workload_ref(name))
        count = ((live or {}).get("spec") or {}).get("replicas")
        return live, count if isinstance(count, int) else None

    def _keeping_keda_counts(self, release: ServingRelease) -> ServingRelease:
        """The counts KEDA set are never lowered, nor dropped to the default, by a step:
        - a fixed count for the stable workload (while a promotion ends, the ScaledObject already targets
          it) or the retiring one (KEDA's until this step) is at least what the workload runs now, so KEDA
          growing it under load since the release was planned is not undone (a forced apply of a lower
          count would take the field and stop pods; server-side-apply.md, "Conflicts");
        - where the stable workload's count is KEDA's and gpuplat-serve still applies one (a promotion cut
          short, then rolled back; a hand-over cut short), the count goes to KEDA through the private
          manager first: a field dropped from an apply that no other manager owns is reset to its default,
          1 ("Field management"; "Transferring ownership")."""
        if release.stack_model == "serving":  # KEDA's target is the stack's own workload, no count of ours
            return release
        if release.retiring is not None:
            _, retiring_now = self._live_count(_workload_name(release.retiring))
            if retiring_now is not None and retiring_now > release.retiring_replicas:
                release = replace(release, retiring_replicas=retiring_now)
        stable = _workload_name(release.stable)
        live, stable_now = self._live_count(stable)
        if live is None or stable_now is None:
            return release
        if release.stable_replicas is not None:
            return replace(release, stable_replicas=max(release.stable_replicas, stable_now))
        if _applies_the_count(live, FIELD_MANAGER):
            only_replicas = {
                "apiVersion": live["apiVersion"],
                "kind": live["kind"],
                "metadata": {"name": stable, "namespace": self.namespace},
                "spec": {"replicas": stable_now},
            }
            # A conflict: the autoscaler wrote the count meanwhile and owns it (the page's "do nothing").
            with contextlib.suppress(_Conflict):
                self.api.apply(only_replicas, manager=HANDOVER_MANAGER, force=False)
        return release

    def _record(self, release: ServingRelease) -> None:
        """The record applied with the resourceVersion this command last read or wrote: an apply whose
        body carries a resourceVersion is refused 409 Conflict where the object changed since
        (server-side-apply.md, "Using Server-Side Apply in a controller"). A command stalled past its
        Lease, whose successor recorded its own release meanwhile, stops there instead of writing its stale
        release over the new holder's."""
        uri = self.facts.model_uri if isinstance(self.facts.model_uri, str) else None
        manifest = record_manifest(self.namespace, release, uri)
        if self.record_version is not None:
            manifest["metadata"]["resourceVersion"] = self.record_version
        try:
            answer = self.api.apply(manifest)
        except _Conflict:
            raise ClusterError(
                f"the release record (ConfigMap {self.namespace}/{RELEASE_RECORD}) changed since this "
                f"command read it: another command carries the release of {self.model} now (this one was "
                "stalled past its Lease). It stopped without writing its step; `gpuplat serve status "
                f"{self.model}` shows where the release stands"
            ) from None
        self.record_version = (answer.get("metadata") or {}).get("resourceVersion")

    def play(self, steps: list[ReleaseStep]) -> ServingRelease | None:
        released: ServingRelease | None = None
        recorded = self.current() if steps else None
        for step in steps:
            self.lock.renew()
            self.say(step.says)
            if _versions(step.release) - _versions(recorded):
                # A step that starts a version is recorded before its workload exists: stopped in its wait
                # (a canary that never gets ready) or killed, the record still names every workload running,
                # so that a rollback finds the canary, and the same command again goes on.
                self._record(step.release)
            self._apply_release(step.release)
            if step.ready is not None:
                workload, replicas = step.ready
                self._wait(
                    f"{workload} ({self.workload_kind[1]})", partial(self._workload_waits, workload, replicas)
                )
            if step.gateways_rolled:
                self._wait(f"the gateways ({GATEWAY} Deployment)", self._gateways_wait)
            for name in step.removes:
                kind = ("v1", "Service") if name.endswith("-replicas") else self.workload_kind
                self.api.delete(ObjectRef(*kind, name, self.namespace))
            self._record(step.release)
            released = recorded = step.release
        if released is not None and _ends_a_promotion(released):
            released = self.hand_replicas_to_keda(released)
        return released

    def hand_replicas_to_keda(self, release: ServingRelease) -> ServingRelease:
        """The stable workload's spec.replicas from gpuplat-serve to KEDA's HorizontalPodAutoscaler without
        a moment at the default of 1 (_keeping_keda_counts: a private manager applies the count alone, then
        the release's objects are applied without it), then recorded."""
        handed = replace(release, stable_replicas=None)
        self._apply_release(handed)
        self._record(handed)
        return handed

    def resume(self, current: ServingRelease | None) -> ServingRelease | None:
        """A command killed between a promotion's last step and the hand-over left the count with
        gpuplat-serve, and the record says so: the next command hands it over before it plans."""
        if current is not None and _ends_a_promotion(current):
            return self.hand_replicas_to_keda(current)
        return current

    def _workload_waits(self, name: str, replicas: int) -> str | None:
        live = self.api.get(self.workload_ref(name))
        return "not created yet" if live is None else rollout_done(live, replicas)

    def _gateways_wait(self) -> str | None:
        return gateways_wait(self.api, self.namespace, GATEWAY)

    def _wait(self, what: str, awaited: Callable[[], str | None]) -> None:
        deadline = self.clock.monotonic() + self.timeout_s
        while True:
            left = awaited()
            if left is None:
                return
            if self.clock.monotonic() >= deadline:
                raise ClusterError(
                    f"{what} did not finish its rollout within {self.timeout_s:.0f} s: {left}. The release "
                    "stopped there (its record says which step ran last); look at the pods "
                    f"(`kubectl -n {self.namespace} get pods`), then run the same command again to go on, "
                    "or `gpuplat serve rollback`"
                )
            self.lock.renew()
            self.clock.sleep(POLL_S)


def _versions(release: ServingRelease | None) -> set[ServedVersion]:
    if release is None:
        return set()
    return {v for v in (release.stable, release.canary, release.retiring) if v is not None}


def _workload_name(version: ServedVersion) -> str:
    return version_track_names(version)[0]


def _applies_the_count(live: Mapping[str, Any], manager: str) -> bool:
    """Whether `manager`'s applies own the workload's spec.replicas (metadata.managedFields, FieldsV1:
    server-side-apply.md, "Field management")."""
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        owned = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and "f:replicas" in owned:
            return True
    return False


def _ends_a_promotion(release: ServingRelease) -> bool:
    return (
        release.stable_replicas is not None
        and release.canary is None
        and release.retiring is None
        and release.stack_model == "gone"
    )


# ------------------------------------------------------------------------------------------- status


@dataclass(frozen=True)
class RunningReplica:
    pod: str
    version: str
    image: str
    model: str
    ready: bool


def running_replicas(api: ClusterApi, namespace: str) -> Iterator[RunningReplica]:
    """What each model-server pod actually runs: its version label, its image and the model it reads."""
    for pod in api.list(ObjectRef("v1", "Pod", "", namespace), f"{LABEL_COMPONENT}={MODEL_SERVER}"):
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        containers = spec.get("containers") or [{}]
        first = containers[0]
        env = {e.get("name"): e.get("value") for e in first.get("env") or []}
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        yield RunningReplica(
            str(meta.get("name")),
            str((meta.get("labels") or {}).get(LABEL_MODEL_VERSION, "(the stack's own model)")),
            str(first.get("image", "")),
            str(env.get(MODEL_ENV, "")),
            ready and not meta.get("deletionTimestamp"),
        )
