"""The real MLflow server as roles/model_registry runs it, on loopback: its unit's command line and
environment and its auth app's configuration rendered from the role's templates, its accounts made by the
role's own task files (ansible-playbook on localhost), MLflow of the role's release in a virtual
environment under build/ (installed once by pip, from pip's own configuration)."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from tests.conftest import ROOT
from tests.roles.ansible_values import render_value

ROLE = ROOT / "roles" / "model_registry"
RELEASE = str(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["model_registry_mlflow_version"])
VENV = ROOT / "build" / f"registry-server-{RELEASE}"


def server_venv() -> Path:
    """MLflow's server of the role's release (the full package, its auth app's extra, PostgreSQL's driver)."""
    python = VENV / "bin" / "python"
    marker = VENV / ".complete"
    if marker.is_file():
        return VENV
    # xdist's workers may each reach here first on a clean checkout: one builds, the others wait for it.
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            _build(python, marker)
    return VENV


def _build(python: Path, marker: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"mlflow[auth]=={RELEASE}",
            # PostgreSQL's driver, which the role installs where the database is PostgreSQL.
            "psycopg2-binary",
        ],
        check=True,
        timeout=1800,
    )
    marker.write_text(RELEASE + "\n", encoding="utf-8")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def role_variables(overrides: dict[str, Any]) -> dict[str, Any]:
    """The role's defaults and vars rendered as Ansible would, with the given settings."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "yes", "1") or value is True
    variables: dict[str, Any] = {**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()), **overrides}
    internal = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    for _ in range(3):  # vars that name other vars
        for key, value in internal.items():
            if key in overrides:
                continue
            try:
                variables[key] = render_value(env, value, variables)
            except jinja2.UndefinedError:
                continue
    return variables


def render_template(name: str, variables: dict[str, Any]) -> str:
    env = jinja2.Environment(keep_trailing_newline=True)
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "yes", "1") or value is True
    env.filters["comment"] = lambda text: "#\n# " + str(text) + "\n#"
    return env.from_string((ROLE / "templates" / name).read_text()).render(
        ansible_managed="Ansible managed", **variables
    )


def unit_command(unit: str) -> tuple[list[str], dict[str, str]]:
    """ExecStart's argv and the Environment= settings of a rendered unit."""
    joined = unit.replace("\\\n", " ")
    command: list[str] = []
    environment: dict[str, str] = {}
    for line in joined.splitlines():
        if line.startswith("ExecStart="):
            command = shlex.split(line.removeprefix("ExecStart="))
        elif line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            environment[key] = value
        elif line.startswith("EnvironmentFile="):
            for setting in Path(line.removeprefix("EnvironmentFile=")).read_text().splitlines():
                key, _, value = setting.partition("=")
                environment[key] = value
    return command, environment


@dataclass
class RegistryServer:
    url: str
    variables: dict[str, Any]
    secrets_dir: Path
    root: Path

    def password(self, user: str) -> str:
        return (self.secrets_dir / user).read_text().strip()

    def converge_accounts(self) -> subprocess.CompletedProcess[str]:
        """The role's secrets and accounts task files against the server, as a converge runs them."""
        return run_role_tasks(self, ["secrets.yml", "accounts.yml"])


def run_role_tasks(server: RegistryServer, task_files: list[str]) -> subprocess.CompletedProcess[str]:
    settings = {
        key: server.variables[key]
        for key in (
            "model_registry_user",
            "model_registry_config_dir",
            "model_registry_data_dir",
            "model_registry_listen_address",
            "model_registry_port",
            "model_registry_users",
            "model_registry_shared_models",
            "model_registry_database",
        )
    }
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": settings,
            "tasks": [
                {
                    "name": f"roles/model_registry {name}",
                    "ansible.builtin.include_role": {"name": "model_registry", "tasks_from": name},
                }
                for name in task_files
            ],
        }
    ]
    playbook = server.root / "play.yml"
    playbook.write_text(yaml.safe_dump(play), encoding="utf-8")
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_NOCOLOR": "1",
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def wait_healthy(url: str, process: subprocess.Popen[str], log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the registry exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the registry at {url} did not answer /health in {timeout_s} s")


POSTGRESQL_BIN = Path("/usr/lib/postgresql/15/bin")  # Debian 12's postgresql-15


def start_postgresql(owner: str) -> Iterator[Path]:
    """A private PostgreSQL cluster of Debian's package, local connections by peer authentication as
    Debian's pg_hba.conf has them, its database role and databases made by the role's own psql script
    (run twice: the second run makes nothing); yields its socket directory."""
    if not (POSTGRESQL_BIN / "initdb").is_file():
        pytest.skip("Debian's postgresql-15 is not installed: `make host` installs it")
    # Outside pytest's directories, which only root may enter.
    cluster = Path(tempfile.mkdtemp(prefix="gpuplat-registry-pg-"))
    shutil.chown(cluster, "postgres", "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    data = cluster / "data"
    subprocess.run(
        [*as_postgres, str(POSTGRESQL_BIN / "initdb"), "-D", str(data), "--auth-local=peer",
         "--auth-host=reject", "-U", "postgres"],
        check=True, capture_output=True, timeout=180, cwd=cluster,
    )  # fmt: skip
    options = f"-k {cluster} -c listen_addresses=''"
    subprocess.run(
        [*as_postgres, str(POSTGRESQL_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-w", "-l",
         str(cluster / "log"), "start"],
        check=True, capture_output=True, timeout=180, cwd=cluster,
    )  # fmt: skip
    try:
        variables = role_variables(
            {
                "model_registry_database": "postgresql",
                "model_registry_user": owner,
                "model_registry_listen_address": "x",
            }
        )
        setup = jinja2.Environment().from_string(variables["__model_registry_pg_setup"]).render(**variables)
        task = next(t for t in yaml.safe_load((ROLE / "tasks" / "database.yml").read_text()) if "block" in t)
        argv = next(t for t in task["block"] if "ansible.builtin.command" in t)["ansible.builtin.command"][
            "argv"
        ]
        psql = [*as_postgres, str(POSTGRESQL_BIN / argv[0]), *argv[1:-1], str(cluster)]
        for run in ("first", "second"):
            made = subprocess.run(psql, input=setup, capture_output=True, text=True, timeout=60, cwd=cluster)
            assert made.returncode == 0, made.stderr
            assert ("CREATE" in made.stdout) == (run == "first"), (run, made.stdout)
        yield cluster
    finally:
        subprocess.run(
            [*as_postgres, str(POSTGRESQL_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
            check=False, capture_output=True, timeout=120, cwd=cluster,
        )  # fmt: skip
        shutil.rmtree(cluster, ignore_errors=True)


def start_registry(
    root: Path,
    users: list[str],
    shared_models: list[dict[str, Any]],
    postgresql_socket: Path | None = None,
) -> Iterator[RegistryServer]:
    """The server with the role's unit and configuration, its accounts converged by the role's tasks; on
    PostgreSQL where a cluster's socket directory is given (start_postgresql), else SQLite."""
    venv = server_venv()
    (root / "data").mkdir(parents=True)
    port = free_port()
    database: dict[str, Any] = (
        {"model_registry_database": "postgresql", "__model_registry_pg_socket": str(postgresql_socket)}
        if postgresql_socket is not None
        else {}
    )
    variables = role_variables(
        {
            **database,
            "model_registry_user": "root",  # the group the configuration file is given to
            "model_registry_listen_address": "127.0.0.1",
            "model_registry_port": port,
            "model_registry_data_dir": str(root / "data"),
            "model_registry_config_dir": str(root / "etc"),
            "model_registry_install_dir": str(venv.parent),
            "model_registry_users": users,
            "model_registry_shared_models": shared_models,
            "model_registry_mlflow_version": RELEASE,
        }
    )
    variables["__model_registry_venv"] = str(venv)
    server = RegistryServer(f"http://127.0.0.1:{port}", variables, root / "etc" / "secrets", root)
    # The configuration needs the operator's password: the role's secrets task file draws it first.
    drawn = run_role_tasks(server, ["secrets.yml"])
    assert drawn.returncode == 0, drawn.stdout[-4000:]
    variables["__model_registry_admin_password"] = server.password(variables["model_registry_admin_user"])
    variables["__model_registry_passwords"] = {
        name: server.password(name)
        for name in [*variables["__model_registry_principals"], "server-secret-key"]
    }
    # The server's environment file, as the role's task writes it.
    service_tasks = yaml.safe_load((ROLE / "tasks" / "service.yml").read_text())
    key_task = next(t for t in service_tasks if t["name"].startswith("Hand the server its key"))
    Path(variables["__model_registry_server_env"]).write_text(
        jinja2.Environment().from_string(key_task["ansible.builtin.copy"]["content"]).render(**variables),
        encoding="utf-8",
    )
    Path(variables["__model_registry_auth_config"]).write_text(
        render_template("basic_auth.ini.j2", variables), encoding="utf-8"
    )
    for database in ("mlflow.db", "basic_auth.db"):
        (root / "data" / database).touch(mode=0o600)
    command, environment = unit_command(render_template("gpuplat-registry.service.j2", variables))
    log = (root / "server.log").open("w")
    process = subprocess.Popen(
        command,
        cwd=root / "data",
        env={"PATH": os.environ["PATH"], "HOME": str(root / "data"), **environment},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(server.url, process, root / "server.log")
        converged = server.converge_accounts()
        assert converged.returncode == 0, converged.stdout[-4000:]
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
