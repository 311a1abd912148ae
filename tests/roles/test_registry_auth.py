"""Who may change the model registry, against the real MLflow server as roles/model_registry runs it
(tests/roles/registry_server.py): anonymous requests refused, the proxied artifact upload included; a
user's run and registered model closed to another team's user (no overwrite, no alias), open to read;
a model the stack shares open to its teams' users alone; the operator (gpuplat) changes any alias; MLflow's
own client, with nothing but ~/.mlflow/credentials as the role writes it, registers and resolves
models:/name@alias. The accounts the role makes survive a second converge unchanged, and a rotated
password replaces the old one.

Not modelled here: the Slurm nodes' homes (the role writes the same file there, tested by rendering), and
PostgreSQL (the same server code on another SQLAlchemy URL)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.serving.registry.mlflow import Credential, MlflowRegistry, RegistryError
from tests.roles.registry_server import RegistryServer, render_template, start_postgresql, start_registry

# Processes of their own (the server, ansible-playbook, MLflow's client) for minutes: the processes tier
# (make test-processes), first, and in one xdist worker (tests/long_first.py), where the module's servers
# are started once, not once per worker.
pytestmark = [pytest.mark.processes, pytest.mark.long, pytest.mark.xdist_group("registry")]

# alice (research) and bob (product) share `embedder` as the local stack does; carol (a third team) does not.
USERS = ["alice", "bob", "carol"]
SHARED = [{"name": "embedder", "users": ["alice", "bob"]}]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    yield from start_registry(tmp_path_factory.mktemp("registry"), USERS, SHARED)


def home_of(registry: RegistryServer, user: str) -> Path:
    """A home holding the credentials file the role writes on the Slurm nodes."""
    home = registry.root / "homes" / user
    (home / ".mlflow").mkdir(parents=True, exist_ok=True)
    credentials = home / ".mlflow" / "credentials"
    credentials.write_text(
        render_template(
            "credentials.j2",
            {
                "__model_registry_client_user": user,
                "__model_registry_client_password": registry.password(user),
            },
        ),
        encoding="utf-8",
    )
    credentials.chmod(0o600)
    return home


def as_user(registry: RegistryServer, user: str, script: str) -> subprocess.CompletedProcess[str]:
    """A Python program run with MLflow's client as `user`: MLFLOW_TRACKING_URI and the home's credentials
    file, nothing else (no MLFLOW_TRACKING_USERNAME/PASSWORD)."""
    python = str(Path(registry.variables["__model_registry_venv"]) / "bin" / "python")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home_of(registry, user)),
        "MLFLOW_TRACKING_URI": registry.url,
        "GIT_PYTHON_REFRESH": "quiet",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }
    return subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False
    )


REGISTER = """
import json, sys, tempfile
import mlflow
from mlflow.models import Model
model, experiment, content, alias = sys.argv[1:5]
experiment_id = mlflow.set_experiment(experiment).experiment_id
with mlflow.start_run(experiment_id=experiment_id) as run:
    with tempfile.TemporaryDirectory() as folder:
        Model(artifact_path="model", run_id=run.info.run_id).save(folder + "/MLmodel")
        open(folder + "/model.zip", "w").write(content)
        mlflow.log_artifacts(folder, artifact_path="model")
version = mlflow.register_model(f"runs:/{run.info.run_id}/model", model)
if alias:
    mlflow.MlflowClient().set_registered_model_alias(model, alias, version.version)
print(json.dumps({"experiment": experiment_id, "run": run.info.run_id, "version": version.version}))
"""

RESOLVE = """
import sys
import mlflow
model, alias = sys.argv[1:3]
version = mlflow.MlflowClient().get_model_version_by_alias(model, alias)
path = mlflow.artifacts.download_artifacts(f"models:/{model}@{alias}")
print(version.version, open(path + "/model.zip").read())
"""


def register(
    registry: RegistryServer, user: str, model: str, content: str, alias: str = ""
) -> dict[str, str]:
    done = as_user(
        registry, user, REGISTER.replace("sys.argv[1:5]", repr([model, f"loop-{user}", content, alias]))
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def resolve(registry: RegistryServer, user: str, model: str, alias: str) -> subprocess.CompletedProcess[str]:
    return as_user(registry, user, RESOLVE.replace("sys.argv[1:3]", repr([model, alias])))


def call(
    registry: RegistryServer,
    method: str,
    path: str,
    user: str | None = None,
    body: dict[str, object] | None = None,
    data: bytes | None = None,
) -> int:
    """The HTTP status of one request, as `user` (None: anonymous)."""
    payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(f"{registry.url}{path}", data=payload, method=method)
    request.add_header("Content-Type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{registry.password(user)}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def artifact_path(run: dict[str, str]) -> str:
    return f"/api/2.0/mlflow-artifacts/artifacts/{run['experiment']}/{run['run']}/artifacts/model/model.zip"


@pytest.fixture(scope="module")
def alices(registry: RegistryServer) -> dict[str, str]:
    """alice (research) registers her own model from her run with MLflow's client, and aliases it."""
    return register(registry, "alice", "alice-ranker", "alice v1", alias="champion")


def test_anonymous_requests_are_refused_the_artifact_upload_included(
    registry: RegistryServer, alices: dict[str, str]
) -> None:
    assert call(registry, "GET", "/health") == 200
    assert call(registry, "GET", "/api/2.0/mlflow/registered-models/search") == 401
    assert call(registry, "POST", "/api/2.0/mlflow/registered-models/create", body={"name": "anon"}) == 401
    assert call(registry, "PUT", artifact_path(alices), data=b"anonymous weights") == 401
    alias = {"name": "alice-ranker", "alias": "champion", "version": "1"}
    assert call(registry, "POST", "/api/2.0/mlflow/registered-models/alias", body=alias) == 401
    with pytest.raises(RegistryError, match="HTTP 401"):
        MlflowRegistry(registry.url).resolve("alice-ranker@champion")


def test_another_teams_user_can_read_but_not_overwrite_or_realias(
    registry: RegistryServer, alices: dict[str, str]
) -> None:
    # The adversary's artifact PUT onto the weights a version points at, as another team's user.
    for other in ("carol", "bob"):
        assert call(registry, "PUT", artifact_path(alices), other, data=b"other weights") == 403, other
        moved = {"name": "alice-ranker", "alias": "champion", "version": "1"}
        assert call(registry, "POST", "/api/2.0/mlflow/registered-models/alias", other, body=moved) == 403
        dropped = {"name": "alice-ranker", "alias": "champion"}
        assert call(registry, "DELETE", "/api/2.0/mlflow/registered-models/alias", other, body=dropped) == 403
        source = {"name": "alice-ranker", "source": f"runs:/{alices['run']}/model", "run_id": alices["run"]}
        assert call(registry, "POST", "/api/2.0/mlflow/model-versions/create", other, body=source) == 403
        tag = {"name": "alice-ranker", "version": "1", "key": "recall_at_1", "value": "1.0"}
        assert call(registry, "POST", "/api/2.0/mlflow/model-versions/set-tag", other, body=tag) == 403
        run = {"experiment_id": alices["experiment"]}
        assert call(registry, "POST", "/api/2.0/mlflow/runs/create", other, body=run) == 403
    # Reading is open: MLflow's client resolves models:/name@alias as the owner and as another team's user.
    for reader in ("alice", "carol"):
        read = resolve(registry, reader, "alice-ranker", "champion")
        assert read.returncode == 0 and read.stdout.split() == ["1", "alice", "v1"], (
            reader,
            read.stderr[-2000:],
        )


def test_a_shared_model_takes_its_teams_versions_and_no_one_elses(
    registry: RegistryServer, alices: dict[str, str]
) -> None:
    bobs = register(registry, "bob", "embedder", "bob's embedder", alias="challenger")
    refused = as_user(
        registry, "carol", REGISTER.replace("sys.argv[1:5]", repr(["embedder", "loop-carol", "x", ""]))
    )
    assert refused.returncode != 0 and "403" in refused.stderr, refused.stderr[-2000:]
    # bob's run stays his own: alice, who shares the model, cannot overwrite the weights of his version.
    assert call(registry, "PUT", artifact_path(bobs), "alice", data=b"alice's weights") == 403
    alias = {"name": "embedder", "alias": "champion", "version": bobs["version"]}
    assert call(registry, "POST", "/api/2.0/mlflow/registered-models/alias", "alice", body=alias) == 200
    assert call(registry, "POST", "/api/2.0/mlflow/registered-models/alias", "carol", body=alias) == 403


def test_the_operator_moves_any_alias_and_gpuplat_asks_as_the_operator(
    registry: RegistryServer, alices: dict[str, str]
) -> None:
    operator = registry.variables["model_registry_admin_user"]
    as_operator = MlflowRegistry(registry.url, credential=Credential(operator, registry.password(operator)))
    as_operator.set_alias("alice-ranker", "challenger", 1)
    assert as_operator.resolve("alice-ranker@challenger").version == 1
    as_operator.delete_alias("alice-ranker", "challenger")
    carol = MlflowRegistry(registry.url, credential=Credential("carol", registry.password("carol")))
    assert carol.resolve("alice-ranker@champion").version == 1
    with pytest.raises(RegistryError, match="HTTP 403"):
        carol.set_alias("alice-ranker", "champion", 1)


def test_a_second_converge_changes_nothing_and_a_rotated_password_replaces_the_old(
    registry: RegistryServer,
) -> None:
    again = registry.converge_accounts()
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    old = registry.password("bob")
    (registry.secrets_dir / "bob").unlink()
    rotated = registry.converge_accounts()
    assert rotated.returncode == 0, rotated.stdout[-3000:]
    new = registry.password("bob")
    assert new != old
    assert call(registry, "GET", "/api/2.0/mlflow/users/get?username=bob", "bob") == 200
    stale = urllib.request.Request(f"{registry.url}/api/2.0/mlflow/users/get?username=bob")
    stale.add_header("Authorization", "Basic " + base64.b64encode(f"bob:{old}".encode()).decode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(stale, timeout=30)
    assert refused.value.code == 401


def test_the_drawn_passwords_are_roots_alone(registry: RegistryServer) -> None:
    secrets = registry.secrets_dir
    assert oct(secrets.stat().st_mode & 0o777) == "0o700"
    for kept in secrets.iterdir():
        if kept.name == "server.env":  # this test's fixture wrote it; the role's task: test_registry_role.py
            continue
        assert oct(kept.stat().st_mode & 0o777) == "0o600", kept


@pytest.fixture(scope="module")
def on_postgresql(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """The registry of a production stack: both stores in PostgreSQL (Debian's postgresql-15), reached over
    the Unix socket as the service user with peer authentication (this test runs it as root, so the role
    is root)."""
    root = tmp_path_factory.mktemp("registry-pg")
    cluster = start_postgresql("root")
    socket_dir = next(cluster)
    try:
        yield from start_registry(root, ["alice", "carol"], [], postgresql_socket=socket_dir)
    finally:
        cluster.close()  # stops the cluster


def test_on_postgresql_the_owner_registers_and_others_are_refused(on_postgresql: RegistryServer) -> None:
    registry = on_postgresql
    uri = registry.variables["__model_registry_backend_store_uri"]
    # No password anywhere: the role's user, over the socket.
    assert uri.removeprefix("postgresql+psycopg2://").split("@")[0] == "root" and "?host=" in uri
    alices = register(registry, "alice", "alice-pg", "alice on postgresql", alias="champion")
    assert call(registry, "PUT", artifact_path(alices), data=b"x") == 401
    assert call(registry, "PUT", artifact_path(alices), "carol", data=b"x") == 403
    moved = {"name": "alice-pg", "alias": "champion", "version": "1"}
    assert call(registry, "POST", "/api/2.0/mlflow/registered-models/alias", "carol", body=moved) == 403
    read = resolve(registry, "carol", "alice-pg", "champion")
    assert read.stdout.split() == ["1", "alice", "on", "postgresql"], read.stderr[-2000:]
    again = registry.converge_accounts()
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]


def test_a_user_removed_from_the_teams_loses_the_account_and_its_grants(registry: RegistryServer) -> None:
    """Day 2: carol leaves the stack's teams. The next converge deletes her MLflow account (her password no
    longer opens the registry, her grants go with it) and forgets her kept password; a further converge
    changes nothing. Runs last: the module's registry has no carol afterwards."""
    carols = register(registry, "carol", "carol-ranker", "carol v1", alias="champion")
    password = registry.password("carol")
    without_carol = RegistryServer(
        registry.url,
        {**registry.variables, "model_registry_users": ["alice", "bob"]},
        registry.secrets_dir,
        registry.root,
    )
    removed = without_carol.converge_accounts()
    assert removed.returncode == 0, removed.stdout[-3000:]
    assert not (registry.secrets_dir / "carol").exists()
    stale = urllib.request.Request(f"{registry.url}/api/2.0/mlflow/users/get?username=carol")
    stale.add_header("Authorization", "Basic " + base64.b64encode(f"carol:{password}".encode()).decode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(stale, timeout=30)
    assert refused.value.code == 401
    # What she made stays, readable by the others, and the operator still manages it.
    assert call(registry, "GET", f"/api/2.0/mlflow/runs/get?run_id={carols['run']}", "alice") == 200
    again = without_carol.converge_accounts()
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
