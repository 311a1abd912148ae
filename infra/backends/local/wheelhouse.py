"""The wheels of the training environment for the local platform's nodes: downloaded once on the host
into the stack's state directory and mounted read-only into every node, where roles/training_env
installs them offline. pip's own configuration decides where they come from (on the test machines, a
find-links directory that holds the CPU build of torch; a plain index would give the CUDA build)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infra.errors import EnvironmentProblem
from infra.nodes.playbook_run import state_dir
from infra.platform.resolve import ResolvedPlatform
from infra.training.job_env import COMPANION_PACKAGES

# The Python of the nodes' base image (Debian 12's python3).
NODE_PYTHON = "3.11"


def ensure_wheelhouse(platform: ResolvedPlatform) -> Path | None:
    """The host directory holding the wheels (downloaded when missing); None without a torch version."""
    version = platform.spec.training.torch_version
    if version is None:
        return None
    directory = state_dir(platform.name) / "wheels"
    marker = directory / f".complete-torch-{version}-py{NODE_PYTHON}"
    if marker.is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--python-version", NODE_PYTHON, "--dest", str(directory),
        f"torch=={version}", *COMPANION_PACKAGES,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise EnvironmentProblem(
            f"could not download the training environment's wheels (torch=={version}, "
            f"{', '.join(COMPANION_PACKAGES)}) for Python {NODE_PYTHON} into {directory}: "
            f"{done.stderr.strip()[-800:]}. Set training.torch_version: null in the stack to go without, or "
            "make the wheels reachable to pip (its find-links or index)."
        )
    marker.write_text(" ".join(command[4:]) + "\n", encoding="utf-8")
    return directory
