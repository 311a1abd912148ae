"""A client of MLflow's Model Registry over its REST API (stdlib only: the CLI, the nodes' programs and
the tests use it without the mlflow package).

The endpoints are those MLflow's own REST store calls (mlflow-skinny 3.18.0,
mlflow/store/model_registry/rest_store.py; paths from mlflow/protos/model_registry_pb2.py), under
/api/2.0: registered-models/create|get|search, model-versions/create|get|search|set-tag and
registered-models/alias (POST sets, GET reads, DELETE removes). Versions are strings on the wire.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from typing import Any

from infra.errors import GpuPlatError

API = "/api/2.0/mlflow"
# MLflow's server refuses a model version whose source is a local path or file:// URI unless it lies in
# the artifacts of a run it names (mlflow 3.17.2, mlflow/server/handlers.py, _validate_source_run): its
# own disk is not where models live. A path on the platform's shared filesystem is therefore recorded as
# shared://<absolute path>, which every node reads at <absolute path>.
SHARED_SCHEME = "shared://"
# A version registered from a run's artifacts (runs:/<run id>/<path>) has for its source the run's artifact
# URI, on this platform's server mlflow-artifacts:/<experiment>/<run id>/artifacts/<path>: the server
# proxies it to <its --artifacts-destination>/<experiment>/<run id>/artifacts/<path> (the client's URL for
# it: mlflow/store/artifact/mlflow_artifacts_repo.py:96-130; the server's store:
# mlflow/server/handlers.py:598-608, mlflow 3.17.2). The registry keeps that destination on the shared
# filesystem, where nodes read it.
ARTIFACTS_SCHEME = "mlflow-artifacts:"
# MLflow's error code for a name that is already taken (mlflow/protos/databricks.proto).
ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


class RegistryError(GpuPlatError):
    """The registry answered with an error, or could not be reached."""


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: int
    source: str
    status: str
    aliases: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)
    artifacts_dir: str = field(default="", compare=False, repr=False)
    """the registry's --artifacts-destination as nodes see it ("" where not known)"""

    @property
    def reference(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def location(self) -> str:
        """Where nodes read the model: a path on the shared filesystem, or the object-store URI."""
        if self.source.startswith(ARTIFACTS_SCHEME) and self.artifacts_dir:
            return proxied_artifact_path(self.source, self.artifacts_dir)
        return from_wire_source(self.source)

    @classmethod
    def from_wire(cls, body: dict[str, Any], artifacts_dir: str = "") -> ModelVersion:
        return cls(
            name=str(body["name"]),
            version=int(body["version"]),
            source=str(body.get("source", "")),
            status=str(body.get("status", "")),
            aliases=tuple(str(a) for a in body.get("aliases", [])),
            tags={str(t["key"]): str(t.get("value", "")) for t in body.get("tags", [])},
            artifacts_dir=artifacts_dir,
        )


@dataclass(frozen=True)
class Credential:
    """A user of the registry's basic-auth app (HTTP basic authentication, as MLflow's client sends it)."""

    username: str
    password: str = field(repr=False)

    def header(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


class MlflowRegistry:
    """One registry server, e.g. MlflowRegistry("http://10.0.0.2:5000", credential=Credential(...))."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 15,
        artifacts_dir: str = "",
        credential: Credential | None = None,
    ) -> None:
        """`artifacts_dir`: the server's --artifacts-destination as nodes see it, where versions registered
        from a run's artifacts are read; `credential`: who asks (None: anonymous, which an authenticating
        registry refuses)."""
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.artifacts_dir = artifacts_dir
        self.credential = credential

    def _version(self, body: dict[str, Any]) -> ModelVersion:
        return ModelVersion.from_wire(body, self.artifacts_dir)

    # Requests

    def _call(self, method: str, endpoint: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.url}{API}/{endpoint}"
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body, doseq=True)
        elif body is not None:
            data = json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.credential is not None:
            request.add_header("Authorization", self.credential.header())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                text = reply.read().decode() or "{}"
        except urllib.error.HTTPError as failure:
            raise _answered(failure, method, endpoint) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as failure:
            reason = getattr(failure, "reason", failure)
            raise RegistryError(
                f"the model registry at {self.url} did not answer ({reason}): is the platform up "
                "(`gpuplat status`), and is this machine allowed to reach the registry's port?"
            ) from None
        answer: dict[str, Any] = json.loads(text)
        return answer

    # Registered models and versions

    def ensure_model(self, name: str, description: str = "") -> None:
        """Create the registered model unless it exists."""
        try:
            self._call("POST", "registered-models/create", {"name": name, "description": description})
        except RegistryError as error:
            if ALREADY_EXISTS not in error.message:
                raise

    def create_version(self, name: str, source: str, tags: dict[str, str] | None = None) -> ModelVersion:
        """A new version of `name` from `source`: a path on the shared filesystem or an object-store URI."""
        wire_tags = [{"key": k, "value": v} for k, v in sorted((tags or {}).items())]
        body = {"name": name, "source": to_wire_source(source), "tags": wire_tags}
        answer = self._call("POST", "model-versions/create", body)
        return self._version(answer["model_version"])

    def version(self, name: str, version: int) -> ModelVersion:
        answer = self._call("GET", "model-versions/get", {"name": name, "version": str(version)})
        return self._version(answer["model_version"])

    def versions(self, name: str | None = None) -> list[ModelVersion]:
        """Every version (of one model, or of all), oldest first, following the pages."""
        found: list[ModelVersion] = []
        query: dict[str, Any] = {"max_results": 200}
        if name is not None:
            query["filter"] = f"name='{_quoted(name)}'"
        while True:
            answer = self._call("GET", "model-versions/search", query)
            found += [self._version(v) for v in answer.get("model_versions", [])]
            token = answer.get("next_page_token")
            if not token:
                break
            query["page_token"] = token
        # Search answers carry no aliases (MLflow keeps them on the registered model).
        aliases: dict[tuple[str, int], list[str]] = {}
        for model in sorted({v.name for v in found}):
            registered = self._call("GET", "registered-models/get", {"name": model})["registered_model"]
            for entry in registered.get("aliases", []):
                aliases.setdefault((model, int(entry["version"])), []).append(str(entry["alias"]))
        found = [replace(v, aliases=tuple(sorted(aliases.get((v.name, v.version), [])))) for v in found]
        return sorted(found, key=lambda v: (v.name, v.version))

    def set_alias(self, name: str, alias: str, version: int) -> None:
        self._call("POST", "registered-models/alias", {"name": name, "alias": alias, "version": str(version)})

    def delete_alias(self, name: str, alias: str) -> None:
        # A DELETE's fields travel in its JSON body (mlflow/server/handlers.py, _get_request_message: only a
        # GET's come from the query string; MLflow 3.17.2).
        self._call("DELETE", "registered-models/alias", {"name": name, "alias": alias})

    def by_alias(self, name: str, alias: str) -> ModelVersion:
        answer = self._call("GET", "registered-models/alias", {"name": name, "alias": alias})
        return self._version(answer["model_version"])

    def set_tag(self, name: str, version: int, key: str, value: str) -> None:
        self._call(
            "POST",
            "model-versions/set-tag",
            {"name": name, "version": str(version), "key": key, "value": value},
        )

    def resolve(self, reference: str) -> ModelVersion:
        """NAME@VERSION (a number) or NAME@ALIAS; a bare NAME is its newest version."""
        name, _, which = reference.partition("@")
        if not name:
            raise RegistryError(f"'{reference}' names no model: write NAME, NAME@VERSION or NAME@ALIAS")
        if not which:
            known = self.versions(name)
            if not known:
                raise RegistryError(f"the registry has no version of '{name}': `gpuplat models register` one")
            return known[-1]
        if which.isdigit():
            return self.version(name, int(which))
        return self.by_alias(name, which)


def to_wire_source(source: str) -> str:
    return SHARED_SCHEME + source if source.startswith("/") else source


def from_wire_source(source: str) -> str:
    return source.removeprefix(SHARED_SCHEME) if source.startswith(SHARED_SCHEME + "/") else source


def proxied_artifact_path(source: str, artifacts_dir: str) -> str:
    """The file path of a proxied artifact URI (mlflow-artifacts:/<path> or mlflow-artifacts://<host>/<path>)
    under the server's artifacts destination."""
    path = urllib.parse.urlparse(source).path
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise RegistryError(
            f"the registry holds a version whose source '{source}' names no path inside its artifacts: "
            "register it again from a run's artifacts (runs:/<run id>/<path>)"
        )
    return "/".join([artifacts_dir.rstrip("/"), *parts])


def _quoted(value: str) -> str:
    return value.replace("'", "\\'")


def _answered(failure: urllib.error.HTTPError, method: str, endpoint: str) -> RegistryError:
    """MLflow answers errors as {"error_code": ..., "message": ...}."""
    try:
        body = json.loads(failure.read().decode() or "{}")
    except (ValueError, OSError):
        body = {}
    if failure.code in (401, 403) and not body:
        # The auth app answers these in plain text (mlflow 3.17.2, mlflow/server/auth/__init__.py:612-626).
        who = "no credential it accepts" if failure.code == 401 else "a user without the permission"
        return RegistryError(
            f"the model registry refused {method} {endpoint}: HTTP {failure.code}, asked by {who}. gpuplat "
            "asks as the registry's operator: on the local platform it reads the password on the registry's "
            "node; elsewhere set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (docs/serving.md, "
            '"Who can change the registry")'
        )
    code = body.get("error_code", f"HTTP {failure.code}")
    message = body.get("message", failure.reason)
    return RegistryError(f"the model registry refused {method} {endpoint}: {code}: {message}")
