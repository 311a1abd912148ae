"""roles/model_registry as it renders, and what the inventory hands it: MLflow's basic-auth app on the
platform's address (never every interface), SQLite on the local stack and Debian's PostgreSQL (peer
authentication, no password) on the others, the secrets root's alone and each user's credential theirs;
the stack's shared models checked against its teams; gpuplat's operator credential never sent to a
registry the user names. The server's behaviour with these settings: tests/roles/test_registry_auth.py."""

from __future__ import annotations

import ipaddress
import os
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from infra.nodes.inventory import platform_vars
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.serving.registry import locate
from infra.serving.registry.locate import operator_credential
from infra.serving.registry.mlflow import Credential
from tests.roles.registry_server import (
    ROLE,
    RegistryServer,
    render_template,
    role_variables,
    run_role_tasks,
    unit_command,
)
from tests.unit.test_hostile_input import refused, run_cli


def with_registry(shared: dict[str, list[str]] | None = None) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        platform["serving"]["registry"] = {"shared_models": shared or {}}

    return mutate


def unit(**overrides: Any) -> tuple[list[str], dict[str, str], str]:
    variables = role_variables(
        {"model_registry_listen_address": "10.213.196.10", "__model_registry_venv": "/opt/venv", **overrides}
    )
    text = render_template("gpuplat-registry.service.j2", variables)
    command, environment = unit_command(text.replace("EnvironmentFile=", "#EnvironmentFile="))
    return command, environment, text


def tasks(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load((ROLE / "tasks" / name).read_text())
    return found


def task(name: str, starting: str) -> dict[str, Any]:
    return next(t for t in tasks(name) if t["name"].startswith(starting))


def test_the_server_runs_mlflows_auth_app_bound_to_the_platform_address() -> None:
    command, environment, text = unit()
    assert command[1:4] == ["server", "--app-name", "basic-auth"]
    assert command[command.index("--host") + 1] == "10.213.196.10"
    assert environment["MLFLOW_AUTH_CONFIG_PATH"] == "/etc/gpuplat-registry/basic_auth.ini"
    # The CSRF key reaches the server from a root-only file, not from the unit anyone can read.
    assert "EnvironmentFile=/etc/gpuplat-registry/secrets/server.env" in text
    assert "SECRET_KEY" not in text.replace("MLFLOW_FLASK_SERVER_SECRET_KEY, read by systemd", "")
    assert command[command.index("--backend-store-uri") + 1] == "sqlite:////shared/registry/mlflow.db"


def test_postgresql_is_reached_as_the_service_user_without_a_password() -> None:
    command, _, text = unit(model_registry_database="postgresql")
    uri = command[command.index("--backend-store-uri") + 1]
    assert uri == "postgresql+psycopg2://gpuplat-registry@/mlflow?host=/var/run/postgresql"
    assert "Requires=postgresql.service" in text
    variables = role_variables(
        {"model_registry_database": "postgresql", "model_registry_listen_address": "x"}
    )
    assert variables["__model_registry_auth_database_uri"].startswith(
        "postgresql+psycopg2://gpuplat-registry@/mlflow_auth?"
    )
    assert "psycopg2-binary" in variables["__model_registry_requirements"]
    assert "postgresql" in variables["__model_registry_packages"]
    # On SQLite, neither.
    sqlite = role_variables({"model_registry_listen_address": "x"})
    assert sqlite["__model_registry_requirements"] == [
        "mlflow[auth]==" + sqlite["model_registry_mlflow_version"]
    ]
    assert "postgresql" not in sqlite["__model_registry_packages"]


def test_the_auth_configuration_names_the_operator_and_reads_by_default() -> None:
    variables = role_variables({"model_registry_listen_address": "x"})
    ini = render_template("basic_auth.ini.j2", {**variables, "__model_registry_admin_password": "drawn"})
    assert "default_permission = READ\n" in ini
    assert "admin_username = gpuplat-operator\n" in ini
    assert "database_uri = sqlite:////shared/registry/basic_auth.db\n" in ini


def test_secrets_are_roots_alone_and_each_users_credential_theirs() -> None:
    directories = task("secrets.yml", "Create the configuration and secrets directories")["loop"]
    assert {"path": "{{ __model_registry_secrets_dir }}", "group": "root", "mode": "0700"} in directories
    kept = task("secrets.yml", "Keep the passwords")["ansible.builtin.copy"]
    assert (kept["owner"], kept["mode"], kept["force"]) == ("root", "0600", False)
    env_file = task("service.yml", "Hand the server its key")["ansible.builtin.copy"]
    assert (env_file["owner"], env_file["mode"]) == ("root", "0600")
    config = task("service.yml", "Write the authentication app's configuration")["ansible.builtin.template"]
    assert (config["owner"], config["group"], config["mode"]) == ("root", "{{ model_registry_user }}", "0640")
    credentials = task("client_credentials.yml", "Write each user's")["ansible.builtin.template"]
    assert credentials["owner"] == "{{ __model_registry_client_user }}" and credentials["mode"] == "0600"
    folder = task("client_credentials.yml", "Create ~/.mlflow")["ansible.builtin.file"]
    assert (folder["owner"], folder["mode"]) == ("{{ item }}", "0700")
    # The SQLite stores (the users' password hashes in basic_auth.db) on the shared filesystem, which every
    # node's users reach: the registry's alone (SQLite gives its journals the database's mode).
    databases = task("database.yml", "SQLite databases")
    assert databases["loop"] == ["mlflow.db", "basic_auth.db"]
    assert (databases["ansible.builtin.file"]["owner"], databases["ansible.builtin.file"]["mode"]) == (
        "{{ model_registry_user }}",
        "0600",
    )
    # Every task that handles a password hides it from Ansible's output.
    for name in ("secrets.yml", "accounts.yml", "client_credentials.yml"):
        for each in tasks(name):
            text = yaml.safe_dump(each)
            secret = any(word in text for word in ("url_password", "_passwords", "content", "stdout"))
            if secret and "ansible.builtin.assert" not in each:
                assert each.get("no_log") is True, (name, each["name"])


def test_the_credentials_file_is_the_one_mlflows_client_reads() -> None:
    text = render_template(
        "credentials.j2", {"__model_registry_client_user": "alice", "__model_registry_client_password": "p"}
    )
    # mlflow 3.17.2, mlflow/utils/credentials.py:37-45: section [mlflow], the variables' names lower-cased.
    assert "[mlflow]\nmlflow_tracking_username = alice\nmlflow_tracking_password = p\n" in text
    destination = task("client_credentials.yml", "Write each user's")["ansible.builtin.template"]["dest"]
    assert destination.endswith("[4] }}/.mlflow/credentials")


def test_the_local_registry_binds_the_head_nodes_address_on_sqlite(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    values = platform_vars(shipped_platforms["local"])
    address = values["model_registry_listen_address"]
    assert ipaddress.ip_address(address).is_private and address != "0.0.0.0"
    assert values["slurm_compute_task_environment"]["MLFLOW_TRACKING_URI"] == f"http://{address}:5000"
    assert values["model_registry_database"] == "sqlite"
    assert values["model_registry_users"] == ["alice", "bob"]
    assert values["model_registry_shared_models"] == [{"name": "embedder", "users": ["alice", "bob"]}]


@pytest.mark.parametrize("stack", ["onprem", "aws-prod"])
def test_production_stacks_keep_the_registry_in_postgresql(
    stack: str, write_stack: Callable[..., Path]
) -> None:
    platform = load_platform(write_stack(stack, with_registry()))
    values = platform_vars(platform)
    assert values["model_registry_database"] == "postgresql"
    if stack == "onprem":  # the gateway node's address from the stack's hosts
        gateway = platform.gateway_pool
        host = next(h.address for h in gateway.spec.hosts if h.name == gateway.node_names()[0])
        assert values["model_registry_listen_address"] == host
    else:  # known on the node only: the role takes its default IPv4 address
        assert "model_registry_listen_address" not in values
    assert role_variables({})["model_registry_listen_address"] == ""


def test_a_shared_model_must_name_teams_of_the_stack(write_stack: Callable[..., Path]) -> None:
    stack = write_stack("local", with_registry({"embedder": ["research", "finance"]}))
    refused(run_cli("plan", "--stack-file", str(stack)), "shared_models", "finance is not a team", "research")


def test_the_operator_password_goes_only_to_the_stacks_own_registry(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    local = shipped_platforms["local"]
    read: list[tuple[str, ...]] = []

    def exec_unchecked(self: object, node: str, *command: str, timeout: float = 60) -> str:
        read.append((node, *command))
        return "kept-password\n"

    monkeypatch.delenv(locate.USERNAME_VARIABLE, raising=False)
    monkeypatch.delenv(locate.PASSWORD_VARIABLE, raising=False)
    monkeypatch.setattr("infra.backends.local.cluster.LocalCluster.exec_unchecked", exec_unchecked)
    assert operator_credential(local, None) == Credential("gpuplat-operator", "kept-password")
    assert read == [("head-0", "cat", "/etc/gpuplat-registry/secrets/gpuplat-operator")]
    # A registry the user names gets no password read from the platform's node.
    assert operator_credential(local, "http://elsewhere:5000") is None
    assert len(read) == 1
    # MLflow's own variables, where set, are the credential (any stack).
    monkeypatch.setenv(locate.USERNAME_VARIABLE, "ops")
    monkeypatch.setenv(locate.PASSWORD_VARIABLE, "secret")
    assert operator_credential(local, "http://elsewhere:5000") == Credential("ops", "secret")
    assert "secret" not in repr(Credential("ops", "secret"))


def test_each_users_loop_job_writes_runs_into_its_own_experiment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's experiment is closed to a job (MLflow's EDIT is its creator's): the loop's default
    is the user's own."""
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("loop_for_registry", ROOT / "examples" / "loop" / "loop.py")
    assert spec is not None and spec.loader is not None
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    monkeypatch.setattr("getpass.getuser", lambda: "bob")
    assert loop.default_experiment() == "loop-bob"


def test_a_converge_to_postgresql_refuses_to_leave_an_earlier_sqlite_registry_behind(tmp_path: Path) -> None:
    """Day 2: a stack whose registry kept its models in SQLite (every stack before PostgreSQL) is not
    switched to an empty PostgreSQL registry; a new one (no mlflow.db) and the local stack go on."""
    data = tmp_path / "data"
    data.mkdir()
    settings = {
        "model_registry_listen_address": "10.0.0.2",
        "model_registry_data_dir": str(data),
        "model_registry_config_dir": str(tmp_path / "etc"),
    }

    def preflight(database: str) -> subprocess.CompletedProcess[str]:
        variables = role_variables({**settings, "model_registry_database": database})
        return run_role_tasks(RegistryServer("", variables, tmp_path / "etc", tmp_path), ["preflight.yml"])

    fresh = preflight("postgresql")
    assert fresh.returncode == 0, fresh.stdout[-2000:]
    (data / "mlflow.db").write_bytes(b"SQLite format 3\x00" + bytes(4080))
    refused = preflight("postgresql")
    assert refused.returncode != 0 and "nothing copies them there" in refused.stdout, refused.stdout[-2000:]
    kept = preflight("sqlite")
    assert kept.returncode == 0, kept.stdout[-2000:]


def test_the_registrys_install_byte_compiles_what_it_installs(tmp_path: Path) -> None:
    """pip with the role's own arguments writes the compiled files beside the sources, so that the
    environment's archive (roles/python_requirements) carries them: the server's user cannot write the
    venv, and without them every start of the server compiled all it imports again."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "gpuplat_demo-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("gpuplat_demo/__init__.py", "ANSWER = 42\n")
        info = "gpuplat_demo-1.0.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpuplat-demo\nVersion: 1.0\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    # The install task's own arguments and environment, rendered with the role's variables (a setting in
    # either that stops the compile fails here: --no-compile, or PIP_NO_COMPILE=0 (pip reads a store_false
    # option's variable as a boolean for its dest, so =1 compiles: pip 23.0.1,
    # src/pip/_internal/cli/parser.py:227-229)); the host's own PIP_* left out.
    install = task("install.yml", "Install MLflow into the virtual environment")
    variables = role_variables({"model_registry_wheelhouse": str(wheels)})
    jinja = jinja2.Environment(undefined=jinja2.StrictUndefined)
    pip_args = jinja.from_string(install["ansible.builtin.pip"]["extra_args"]).render(**variables)
    environment = install.get("environment", {})
    if isinstance(environment, str):  # one variable's dict
        environment = yaml.safe_load(jinja.from_string(environment).render(**variables)) or {}
    pip_env = {key: jinja.from_string(str(value)).render(**variables) for key, value in environment.items()}
    host_env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--target", str(target), *shlex.split(pip_args), "gpuplat-demo==1.0"],
        capture_output=True, text=True, timeout=120, check=False, env={**host_env, **pip_env},
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert (target / "gpuplat_demo" / "__init__.py").is_file()
    assert list((target / "gpuplat_demo" / "__pycache__").glob("__init__.*.pyc")), (pip_args, pip_env)
