"""A Kubernetes API server as the official client's transport sees it: put in place of the urllib3 pool
manager under `kubernetes.client.rest.RESTClientObject`, so that everything above it (the ApiClient's
paths, query strings, headers, JSON encoding, its exceptions per status) is the real client's.

What it models, and only that: objects stored by path with a resourceVersion (a new one per write) and a
generation (a new one when the spec changes); server-side apply (PATCH, `application/apply-patch+yaml`)
merging the body into the stored object, creating it where there is none; create (409 AlreadyExists),
update (409 Conflict on a stale resourceVersion), delete (404 when gone); Status bodies on failure as the
API server writes them (apimachinery pkg/apis/meta/v1 types.go, Status). Every object applied, created or
updated, and every object answered, is checked against the real schema of the stacks' Kubernetes version
(tests/k8s_schemas.py). Field ownership as server-side-apply.md describes it (kubernetes/website
content/en/docs/reference/using-api/server-side-apply.md, "Field management", "Conflicts", "Operations in
scope for field management"), at the granularity of leaf fields with every list atomic (the real server
merges a list of type map by its keys): an apply that changes a field another manager owns is a 409 unless
forced (forced, the others lose it); two managers applying one value share it; a field a manager applied
before and dropped now, owned by no other manager, is removed from the object, a workload's spec.replicas
reset to its default of 1; an update (`scale`, a controller's write) that changes a field takes it from
every other manager; metadata.managedFields as the server writes it (FieldsV1). Not modelled: admission,
watches, and the controllers (a test's `before` moves the workloads' status as they would).

The pods' proxy subresource (GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH) answers what the test
puts in `pod_answers` for that pod and port, as text, where the pod exists and runs with an address; a pod
that is missing is a 404, one that does not run or has no answer for the port a 503 with the API server's
words for a pod it cannot dial (apimachinery pkg/util/proxy/transport.go RoundTrip: NewServiceUnavailable
"error trying to reach service: ..."). Not modelled: the NetworkPolicies between the API server and the pod
(the proxy dials the pod's address from the API server: a policy that admits only some pods to the port
refuses it), a pod with no address yet (400 "address not allowed")."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import format_datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kubernetes.client import ApiClient, Configuration
from urllib3.exceptions import ProtocolError

from tests.k8s_schemas import assert_accepted

HOST = "https://api.cluster.example:6443"
_POD_PROXY = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+):(\d+)/proxy/(.*)$")
# MicroTime as the API server writes it (apimachinery pkg/apis/meta/v1/micro_time.go, RFC3339Micro).
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@dataclass(frozen=True)
class Request:
    verb: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


class Response:
    """What RESTResponse reads of a urllib3 response (and the client returns as is, unread, for
    _preload_content=False)."""

    def __init__(self, status: int, body: Any, reason: str = "", text: str | None = None) -> None:
        self.status = status
        self.reason = reason
        self.data = json.dumps(body).encode() if text is None else text.encode()
        content_type = "application/json" if text is None else "text/plain; version=0.0.4; charset=utf-8"
        self.headers: dict[str, str] = {"Content-Type": content_type}

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


Leaf = tuple[str, ...]
# What no manager owns: the object's identity and what the server writes itself.
_UNOWNED = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}
_SERVER_WRITES = ("status", "managedFields", "resourceVersion", "generation", "uid", "creationTimestamp")
# Defaults the API server gives a field nobody set (a Deployment's and a LeaderWorkerSet's spec.replicas: 1).
_DEFAULTS = {("Deployment", ("spec", "replicas")): 1, ("LeaderWorkerSet", ("spec", "replicas")): 1}


def leaves(obj: Any, prefix: Leaf = ()) -> dict[Leaf, Any]:
    """Each leaf field of `obj` and its value; a list is one leaf (atomic)."""
    if not isinstance(obj, dict) or not obj:
        return {} if not prefix or prefix in _UNOWNED else {prefix: obj}
    found: dict[Leaf, Any] = {}
    for key, value in obj.items():
        path = (*prefix, key)
        if path in _UNOWNED or (key in _SERVER_WRITES and len(path) <= 2):
            continue
        found.update(leaves(value, path))
    return found


def _remove(obj: dict[str, Any], path: Leaf) -> None:
    parents = [obj]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for parent, key in zip(reversed(parents[:-1]), reversed(path[:-1]), strict=True):
        if parent.get(key) == {}:
            parent.pop(key)


def _fields_v1(paths: set[Leaf]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _refused_change(live: dict[str, Any] | None, applied: dict[str, Any]) -> Response | None:
    """What the API server refuses of an apply: a uid in the body names the object (409 where there is
    none, 422 where it is another, uid being immutable); on an existing object a resourceVersion in the
    body is a precondition (409 when stale: server-side-apply.md, "Using Server-Side Apply in a
    controller"), and a workload's spec.selector is immutable (422: apps/v1 validation,
    ValidateDeploymentUpdate)."""
    name = applied["metadata"]["name"]
    uid = applied["metadata"].get("uid")
    if live is None:
        if uid is None:
            return None
        # An apply naming a uid does not create (k8s.io/apiserver pkg/endpoints/handlers/patch.go,
        # patcher.applyPatch, v1.34).
        message = (
            f'Operation cannot be fulfilled on "{name}": uid mismatch: the provided object specified uid '
            f"{uid}, and no existing object was found"
        )
        return Response(409, status(409, "Conflict", message), "Conflict")
    if uid is not None and uid != live["metadata"].get("uid"):
        message = f'"{name}" is invalid: metadata.uid: Invalid value: "{uid}": field is immutable'
        return Response(422, status(422, "Invalid", message), "Unprocessable Entity")
    version = applied["metadata"].get("resourceVersion")
    if version is not None and version != live["metadata"]["resourceVersion"]:
        message = f'Operation cannot be fulfilled on "{name}": the object has been modified'
        return Response(409, status(409, "Conflict", message), "Conflict")
    selector = (applied.get("spec") or {}).get("selector")
    if live.get("kind") == "Deployment" and selector is not None and selector != live["spec"].get("selector"):
        message = f'Deployment.apps "{name}" is invalid: spec.selector: Invalid value: field is immutable'
        return Response(422, status(422, "Invalid", message), "Unprocessable Entity")
    return None


def _merge(live: Any, applied: Any) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        merged = dict(live)
        for key, value in applied.items():
            merged[key] = _merge(live.get(key), value)
        return merged
    return applied


@dataclass
class FakeCluster:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    refuse: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """(verb, path) -> (status, message) answered instead."""
    refuse_headers: dict[str, str] = field(default_factory=dict)
    """headers sent with every refusal of `refuse` (a 429's Retry-After)"""
    lose_answer: set[tuple[str, str]] = field(default_factory=set)
    """(verb, path) carried out once, its answer then lost: the connection reset (each entry used once)"""
    before: Callable[[Request, FakeCluster], None] | None = None
    """Runs before each request is answered: another client's writes, a controller's progress."""
    unreachable: Exception | None = None
    server_now: Callable[[], datetime] | None = None
    """The API server's clock, sent in each answer's Date header (as Go's net/http server does)."""
    owners: dict[str, dict[tuple[str, str], set[Leaf]]] = field(default_factory=dict)
    """path -> (manager, "Apply" or "Update") -> the leaf fields it owns."""
    pod_answers: dict[tuple[str, int], Callable[[], str]] = field(default_factory=dict)
    """(pod, port) -> what its server answers now, through the pods/proxy subresource."""
    _version: int = 100
    uids_given: set[str] = field(default_factory=set)
    """the paths an object was ever stored at (one created again there gets another uid)"""

    def client(self) -> ApiClient:
        configuration = Configuration()
        configuration.host = HOST
        configuration.api_key = {"authorization": "Bearer test-token"}
        api_client = ApiClient(configuration)
        api_client.rest_client.pool_manager = self
        return api_client

    def next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def store(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Keeps `manifest` at `path` with a new resourceVersion, as another writer would."""
        previous = self.objects.get(path)
        stored: dict[str, Any] = json.loads(json.dumps(manifest))
        meta = stored.setdefault("metadata", {})
        meta["resourceVersion"] = self.next_version()
        # A name created again is another object, with another uid.
        meta.setdefault(
            "uid",
            f"uid-{meta['name']}"
            if path not in self.uids_given
            else f"uid-{meta['name']}-{meta['resourceVersion']}",
        )
        self.uids_given.add(path)
        meta.setdefault("creationTimestamp", "2026-12-06T20:00:00Z")
        generation = int((previous or {}).get("metadata", {}).get("generation") or 0)
        changed = previous is None or previous.get("spec") != stored.get("spec")
        meta["generation"] = generation + 1 if changed else generation
        for (kind, at), default in _DEFAULTS.items():
            if stored.get("kind") == kind and at[0] in stored:
                stored[at[0]].setdefault(at[1], default)
        entries = self.owners.get(path, {})
        meta["managedFields"] = [
            {
                "manager": manager,
                "operation": operation,
                "apiVersion": stored["apiVersion"],
                "time": "2026-12-06T20:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields_v1(paths),
            }
            for (manager, operation), paths in entries.items()
            if paths
        ]
        if not meta["managedFields"]:
            del meta["managedFields"]
        self.objects[path] = stored
        return stored

    def _take(self, path: str, manager: str, operation: str, taken: set[Leaf]) -> None:
        """`manager` owns `taken` now, alone."""
        entries = self.owners.setdefault(path, {})
        for paths in entries.values():
            paths -= taken
        entries.setdefault((manager, operation), set()).update(taken)

    def update_fields(self, path: str, manager: str, changes: dict[Leaf, Any]) -> dict[str, Any]:
        """An update (not an apply) by `manager`, as a controller writes (the HorizontalPodAutoscaler through
        the scale subresource): it never conflicts, and the fields whose value it changes become its own."""
        live = json.loads(json.dumps(self.objects[path]))
        current = leaves(live)
        changed = {leaf for leaf, value in changes.items() if current.get(leaf) != value}
        for leaf, value in changes.items():
            node = live
            for key in leaf[:-1]:
                node = node.setdefault(key, {})
            node[leaf[-1]] = value
        self._take(path, manager, "Update", changed)
        return self.store(path, live)

    def scale(self, path: str, replicas: int, manager: str = "kube-controller-manager") -> None:
        """KEDA's HorizontalPodAutoscaler sets a workload's count (the scale subresource, an update)."""
        self.update_fields(path, manager, {("spec", "replicas"): replicas})

    def applied(self, path_end: str = "") -> list[Request]:
        return [r for r in self.requests if r.verb == "PATCH" and r.path.endswith(path_end)]

    def request(self, method: str, url: str, **kwargs: Any) -> Response:
        if self.unreachable is not None:
            raise self.unreachable
        parts = urlsplit(url)
        assert f"{parts.scheme}://{parts.netloc}" == HOST
        headers = kwargs.get("headers") or {}
        assert headers.get("authorization") == "Bearer test-token", headers
        query = dict(parse_qsl(parts.query))
        if method == "GET" and kwargs.get("fields"):
            query.update(dict(kwargs["fields"]))
        raw = kwargs.get("body")
        body = json.loads(raw) if raw else None
        request = Request(method, parts.path, query, headers.get("Content-Type", ""), body)
        self.requests.append(request)
        if self.before is not None:
            self.before(request, self)
        if (method, parts.path) in self.refuse:
            code, message = self.refuse[(method, parts.path)]
            reason = {403: "Forbidden", 404: "NotFound", 409: "Conflict"}.get(code, "InternalError")
            refused = Response(code, status(code, reason, message), reason)
            refused.headers.update(self.refuse_headers)
            return self._dated(refused)
        proxied = _POD_PROXY.match(parts.path)
        answer = (
            self._proxy(request, *proxied.groups())
            if proxied
            else getattr(self, f"_{method.lower()}")(request)
        )
        if (method, parts.path) in self.lose_answer:
            self.lose_answer.discard((method, parts.path))
            raise lost_connection()
        if isinstance(answer, dict) and answer.get("kind") not in ("Status", None):
            for item in answer.get("items", [answer]):
                assert_accepted(item)
        return self._dated(answer if isinstance(answer, Response) else Response(200, answer))

    def _dated(self, response: Response) -> Response:
        """Every answer, a refusal too, carries the Date header (Go's net/http server writes one)."""
        if self.server_now is not None:
            response.headers["Date"] = format_datetime(self.server_now(), usegmt=True)
        return response

    def _name(self, path: str) -> str:
        return path.rsplit("/", 1)[1]

    def _proxy(self, request: Request, namespace: str, pod: str, port: str, _path: str) -> Response:
        assert request.verb == "GET", request
        live = self.objects.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
        if live is None:
            return Response(404, status(404, "NotFound", f'pods "{pod}" not found'), "Not Found")
        answer = self.pod_answers.get((pod, int(port)))
        running = (live.get("status") or {}).get("phase") == "Running" and (live.get("status") or {}).get(
            "podIP"
        )
        if answer is None or not running:
            message = f"error trying to reach service: dial tcp 10.0.0.1:{port}: connect: connection refused"
            return Response(503, status(503, "ServiceUnavailable", message), "Service Unavailable")
        return Response(200, None, text=answer())

    def _get(self, request: Request) -> Response | dict[str, Any]:
        if request.path in self.objects:
            return self.objects[request.path]
        prefix = request.path + "/"
        wanted = dict(p.split("=", 1) for p in request.query.get("labelSelector", "").split(",") if p)
        items = [
            obj
            for path, obj in self.objects.items()
            if path.startswith(prefix)
            and "/" not in path[len(prefix) :]
            and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        if items or request.path.endswith("/pods"):
            return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
        return Response(404, status(404, "NotFound", f'"{self._name(request.path)}" not found'), "Not Found")

    def _patch(self, request: Request) -> Response | dict[str, Any]:
        assert request.content_type == "application/apply-patch+yaml", request
        manager = request.query.get("fieldManager")
        assert manager, request
        body = request.body
        assert body["metadata"]["name"] == self._name(request.path)
        assert "managedFields" not in body["metadata"], "an apply cannot set managedFields"
        live = self.objects.get(request.path)
        refused = _refused_change(live, body)
        if refused is not None:
            return refused
        applied = leaves(body)
        entries = self.owners.setdefault(request.path, {})
        current = leaves(live) if live else {}
        conflicts = sorted(
            (other, leaf)
            for (other, _), paths in entries.items()
            if other != manager
            for leaf in paths & set(applied)
            if current.get(leaf) != applied[leaf]
        )
        if conflicts and request.query.get("force") != "true":
            said = ", ".join(f'conflict with "{m}": .{".".join(leaf)}' for m, leaf in conflicts)
            message = f"Apply failed with {len(conflicts)} conflict(s): {said}"
            return Response(409, status(409, "Conflict", message), "Conflict")
        merged = _merge(live, body) if live else body
        before = entries.get((manager, "Apply"), set())
        for leaf in before - set(applied):
            if not any(leaf in paths for key, paths in entries.items() if key != (manager, "Apply")):
                _remove(merged, leaf)
        for other_key, paths in entries.items():
            if other_key[0] != manager:
                paths -= {leaf for _, leaf in conflicts}
        entries[(manager, "Apply")] = set(applied)
        if live is not None:
            merged["metadata"] = {
                **merged["metadata"],
                "resourceVersion": live["metadata"]["resourceVersion"],
            }
        merged["metadata"].pop("managedFields", None)
        assert_accepted({k: v for k, v in merged.items() if k != "status"})
        return self.store(request.path, merged)

    def _check_times(self, body: dict[str, Any]) -> None:
        if body.get("kind") == "Lease":
            for key in ("acquireTime", "renewTime"):
                value = body["spec"].get(key)
                assert value is None or MICRO_TIME.match(value), f"Lease {key} {value!r} is no MicroTime"

    def _post(self, request: Request) -> Response | dict[str, Any]:
        body = request.body
        self._check_times(body)
        assert "resourceVersion" not in body["metadata"], "a create carries no resourceVersion"
        assert_accepted(body)
        path = f"{request.path}/{body['metadata']['name']}"
        if path in self.objects:
            message = f'leases.coordination.k8s.io "{body["metadata"]["name"]}" already exists'
            return Response(409, status(409, "AlreadyExists", message), "Conflict")
        self.owners[path] = {(request.query.get("fieldManager", "unknown"), "Update"): set(leaves(body))}
        return Response(201, self.store(path, body))

    def _put(self, request: Request) -> Response | dict[str, Any]:
        body = request.body
        self._check_times(body)
        assert_accepted(body)
        live = self.objects.get(request.path)
        if live is None:
            return Response(
                404, status(404, "NotFound", f'"{self._name(request.path)}" not found'), "Not Found"
            )
        if not body["metadata"].get("resourceVersion"):
            # A Lease's strategy allows no unconditional update: 422, not 409 (apiserver pkg/registry/
            # generic/registry/store.go, Update: "must be specified for an update").
            message = f'leases.coordination.k8s.io "{self._name(request.path)}" is invalid: '
            message += "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
            return Response(422, status(422, "Invalid", message), "Unprocessable Entity")
        if body["metadata"].get("resourceVersion") != live["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{self._name(request.path)}": '
                "the object has been modified; please apply your changes to the latest version and try again"
            )
            return Response(409, status(409, "Conflict", message), "Conflict")
        self.owners[request.path] = {
            (request.query.get("fieldManager", "unknown"), "Update"): set(leaves(body))
        }
        body["metadata"].pop("managedFields", None)
        return self.store(request.path, body)

    def _delete(self, request: Request) -> Response | dict[str, Any]:
        self.owners.pop(request.path, None)
        if self.objects.pop(request.path, None) is None:
            return Response(
                404, status(404, "NotFound", f'"{self._name(request.path)}" not found'), "Not Found"
            )
        return status(200, "", "") | {"status": "Success"}


def lost_connection() -> Exception:
    """What urllib3 raises where the connection is reset before the answer is read (its ProtocolError
    "Connection aborted.", wrapping the socket's error), its own retries off."""
    return ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))


def rolls_out(request: Request, cluster: FakeCluster) -> None:
    """The workload controllers, done at once: each Deployment or LeaderWorkerSet read has every replica
    of its latest spec updated and available (ready)."""
    if request.verb != "GET":
        return
    obj = cluster.objects.get(request.path)
    if obj is None or obj["kind"] not in ("Deployment", "LeaderWorkerSet"):
        return
    replicas = obj["spec"].get("replicas", 1)
    obj["status"] = {
        "observedGeneration": obj["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        **({"availableReplicas": replicas} if obj["kind"] == "Deployment" else {}),
    }
