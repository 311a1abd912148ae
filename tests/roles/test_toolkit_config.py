"""The container toolkit's config.toml as roles/container_runtime renders it, checked against the rules of
the v1.17 runtime hook: which device requests an unprivileged container is granted
(cmd/nvidia-container-runtime-hook/container_config.go getDevices; internal/modifier/cdi.go for CDI mode,
NVIDIA/nvidia-container-toolkit). The GPUs a Kubernetes pod is allocated must reach it the way the device
plugin hands them over (infra/k8s/operators.py), and a container asking for GPUs through
NVIDIA_VISIBLE_DEVICES by itself must get none.

Not modelled: the runtime itself (no GPU, no containerd here); the rules are restated from the source."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import pytest

from infra.k8s.facts import host_path_facts
from infra.k8s.operators import releases
from infra.nodes.role_templates import render_role_template
from infra.platform.resolve import load_platform

ROOT = Path(__file__).resolve().parents[2]
Request = Literal["envvar", "volume-mounts", "cdi-annotation"]


def granted(config: dict[str, Any], request: Request, privileged: bool = False) -> bool:
    """v1.17: volume mounts only with accept-nvidia-visible-devices-as-volume-mounts; NVIDIA_VISIBLE_DEVICES
    only when privileged or with accept-nvidia-visible-devices-envvar-when-unprivileged; CDI annotations
    (CDI mode) whatever the privileges."""
    if request == "cdi-annotation":
        return bool(config["nvidia-container-runtime"]["mode"] == "cdi")
    if request == "volume-mounts":
        return bool(config["accept-nvidia-visible-devices-as-volume-mounts"])
    return privileged or bool(config["accept-nvidia-visible-devices-envvar-when-unprivileged"])


def rendered(engine: str) -> dict[str, Any]:
    text = render_role_template("container_runtime", "config.toml.j2", {"container_runtime_engine": engine})
    return tomllib.loads(text)


def device_list_strategy(stack: str) -> Request:
    """How the GPU operator's device plugin hands a pod its GPUs on the stack (its default: envvar)."""
    platform = load_platform(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    [operator] = [r for r in releases(platform, host_path_facts(platform)) if r.name == "gpu-operator"]
    env = {e["name"]: e["value"] for e in operator.values["devicePlugin"].get("env", [])}
    strategy = env.get("DEVICE_LIST_STRATEGY", "envvar")
    assert strategy in ("envvar", "volume-mounts")
    return "volume-mounts" if strategy == "volume-mounts" else "envvar"


def test_an_unprivileged_pod_gets_the_gpus_the_device_plugin_allocated() -> None:
    """onprem-k8s: the nodes run this role's toolkit (containerd)."""
    assert granted(rendered("containerd"), device_list_strategy("onprem-k8s"))


@pytest.mark.parametrize("engine", ["containerd", "docker"])
def test_a_container_asking_by_environment_variable_alone_gets_no_gpu(engine: str) -> None:
    config = rendered(engine)
    assert not granted(config, "envvar")
    assert granted(config, "envvar", privileged=True)


def test_cdi_only_nodes_grant_cdi_requests() -> None:
    """engine none (podman, enroot): CDI mode; devices by CDI name, no environment variable."""
    config = rendered("none")
    assert config["nvidia-container-runtime"]["mode"] == "cdi"
    assert granted(config, "cdi-annotation") and not granted(config, "envvar")
