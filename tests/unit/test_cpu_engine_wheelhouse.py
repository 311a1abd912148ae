"""The CPU reference engine on the local platform: installed offline from the host's wheelhouse, like
MLflow's server and the training environment, so that its environment is archived after the install and
restored by the next cold `up` (roles/python_requirements) instead of pip resolving from the index."""

from __future__ import annotations

from typing import Any

import jinja2
import yaml

from infra.backends.local.wheelhouse import wheel_requirements
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
    assert set(cpu_engine_packages(local)) <= set(wheel_requirements(local))
    assert not any(r.startswith("torch==") for r in wheel_requirements(local))


def test_no_wheelhouse_for_the_engine_off_the_local_platform(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    for name, platform in shipped_platforms.items():
        if platform.spec.backend != "local":
            assert "inference_server_wheelhouse" not in platform_vars(platform), name


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
    for task in tasks:
        if "ansible.builtin.pip" in task:
            assert "__inference_server_cpu_pip_source" in task["ansible.builtin.pip"]["extra_args"]
