"""The Kubernetes API from inside a pod with the standard library only (the guard Job's zip application
cannot carry the official client): HTTPS to the API server the kubelet names in the pod's environment,
authenticated by the pod's ServiceAccount token and verified against the cluster's CA, both from the files
the kubelet mounts. Its calls are those of infra/k8s/serving_apply.py ClusterApi that the guard makes
(get, list, create, update, server-side apply), each refusal one of infra/k8s/api_refs.py's errors.

Kubernetes facts (kubernetes/website content/en/docs/tasks/run-application/access-api-from-pod.md and
reference/access-authn-authz/service-accounts-admin.md, v1.34):
- the API server is at https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; the token, the CA
  bundle and the namespace are /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace};
- the token is a projected, bound token the kubelet rotates before it expires (by default it is valid an
  hour and refreshed at 80 % of that), "the application is responsible for reloading the token when it
  rotates": it is read again for every call;
- server-side apply is a PATCH with `application/apply-patch+yaml`; JSON is YAML, so the body is JSON.

Every call goes through infra/k8s/api_retry.py, the policy the CLI's calls follow too (429 and 5xx
answers, and answers that never came, tried again within bounds that never outlast the guard's Lease).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from infra.k8s.api_refs import ClusterError, NotFound, ObjectRef, Unavailable, refusal
from infra.k8s.api_retry import Retrier, retry_after_s, unanswered

ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
TIMEOUT_S = 15.0
"""an API call or a pod's metrics that hang must not hold the guard past its look (and its Lease)"""


class KubeHttp:
    """`base`: the API server's URL; `token` and `ca`: the files to read them from (`ca` None: plain HTTP, a
    test's loopback server only)."""

    def __init__(self, base: str, token: Path, ca: Path | None, manager: str) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.manager = manager
        self._context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
        self._server_clock: tuple[datetime, float] | None = None
        self.retry = Retrier(try_s=TIMEOUT_S)
        """the policy every call follows; the guard bounds it by its Lease (retry.bound)"""

    @classmethod
    def in_cluster(cls, manager: str) -> KubeHttp:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ClusterError(
                "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: the guard runs in a pod "
                "of the cluster, started by `gpuplat serve deploy ... --detach` or `serve guard --detach`"
            )
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        return cls(f"https://{host}:{port}", ACCOUNT_DIR / "token", ACCOUNT_DIR / "ca.crt", manager)

    def server_now(self) -> datetime:
        """The API server's time: the Date header of its last answer plus the time passed here since (as
        serving_apply.ClusterApi.server_now); this pod's clock before any answer came."""
        if self._server_clock is None:
            return datetime.now(UTC)
        said, at = self._server_clock
        return said + timedelta(seconds=time.monotonic() - at)

    def _note_server_clock(self, date: str | None) -> None:
        with contextlib.suppress(TypeError, ValueError):
            if date:
                self._server_clock = (parsedate_to_datetime(date).astimezone(UTC), time.monotonic())

    def _call(
        self,
        verb: str,
        ref: ObjectRef,
        path: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One call under the retry policy (api_retry.Retrier.call: a write's object read back for a 409
        after a try that was not answered)."""
        return self.retry.call(
            f"{verb} {ref}",
            lambda: self._once(verb, ref, path, query, body, content_type),
            verb=verb,
            body=body,
            read_back=lambda: self.get(ref),
        )

    def _once(
        self,
        verb: str,
        ref: ObjectRef,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
    ) -> dict[str, Any]:
        try:
            token = self.token.read_text().strip()
        except OSError as error:
            raise ClusterError(f"the pod's ServiceAccount token could not be read ({error})") from None
        url = self.base + path + ("?" + urlencode(dict(query)) if query else "")
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode() if body is not None else None,
            method=verb,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "Content-Type": content_type,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self._context) as answer:
                self._note_server_clock(answer.headers.get("Date"))
                text = answer.read()
        except urllib.error.HTTPError as error:
            self._note_server_clock(error.headers.get("Date"))
            raise _refused(error, verb, ref, self.base) from None
        except (OSError, ValueError, http.client.HTTPException) as error:
            # URLError is an OSError (its reason the socket's error); so are timeouts and TLS failures. An
            # answer cut short (IncompleteRead) is an HTTPException only.
            cause = error.reason if isinstance(error, urllib.error.URLError) else error
            said = f"the Kubernetes API at {self.base} cannot be reached ({type(error).__name__}: {error})"
            if isinstance(cause, BaseException) and unanswered(cause):
                raise Unavailable(f"{said} at {verb} {ref}") from None
            raise ClusterError(said) from None
        try:
            found = json.loads(text) if text else {}
        except ValueError:
            raise ClusterError(f"the API at {self.base} answered {verb} {ref} not in JSON") from None
        return found if isinstance(found, dict) else {}

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            return self._call("GET", ref, ref.path())
        except NotFound:
            return None

    def list(self, ref: ObjectRef, label_selector: str) -> list[dict[str, Any]]:
        answer = self._call("GET", ref, ref.path(collection=True), {"labelSelector": label_selector})
        return [item for item in answer.get("items") or [] if isinstance(item, dict)]

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(manifest)
        return self._call("POST", ref, ref.path(collection=True), {"fieldManager": self.manager}, manifest)

    def update(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """A PUT: the manifest carries the resourceVersion it was read at; a stale one is a Conflict."""
        ref = ObjectRef.of(manifest)
        return self._call("PUT", ref, ref.path(), {"fieldManager": self.manager}, manifest)

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply, forced (the objects are gpuplat-serve's); a resourceVersion in the manifest
        makes it conditional (409 where the object changed since)."""
        ref = ObjectRef.of(manifest)
        query = {"fieldManager": self.manager, "force": "true"}
        return self._call("PATCH", ref, ref.path(), query, manifest, APPLY_CONTENT_TYPE)


def _refused(error: urllib.error.HTTPError, verb: str, ref: ObjectRef, server: str) -> ClusterError:
    said = ""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        said = str(json.loads(error.read() or b"{}").get("message") or "")
    said = said or str(error.reason or "")
    forbidden = (
        f"the Kubernetes API at {server} refused {verb} on {ref.resource} ({ref}): HTTP {error.code}, "
        f"{said}. The guard's Role (gpuplat-serve-guard-MODEL-ID) grants only what the guard needs: "
        "docs/serving.md, The guard Job on Kubernetes"
    )
    retry_after = retry_after_s(error.headers.get("Retry-After") if error.headers else None)
    return refusal(error.code, said, verb, ref, server, forbidden, retry_after)


def read_pod(address: str, port: int, path: str) -> str:
    """What a pod's server answers at `path`, asked at its address directly (plain HTTP, as Prometheus
    scrapes it): the guard's label is what the serving namespace's NetworkPolicies admit to those ports."""
    host = f"[{address}]" if ":" in address else address
    url = f"http://{host}:{port}/{path.lstrip('/')}"
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return str(answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        raise ClusterError(f"{address}:{port} answered HTTP {error.code}") from None
