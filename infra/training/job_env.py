"""What the platform gives training jobs: PyTorch in one environment on the shared filesystem, the
environment every Slurm task starts with (roles/slurm_compute's TaskProlog), and a metrics directory
that node_exporter publishes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.platform.resolve import ResolvedPlatform

# The local platform's nodes find the host's wheels here (infra/backends/local/wheelhouse.py mounts them).
LOCAL_WHEELHOUSE = "/opt/gpuplat/wheels"
# ... and keep the Python environments installed from those wheels here (roles/python_requirements's
# archives; infra/backends/local/host_caches.py mounts the host's directory, writable).
LOCAL_ENVIRONMENT_ARCHIVES = "/var/cache/gpuplat/environments"
# node_exporter's textfile collector directory (roles/node_exporter's default), where jobs write.
JOB_METRICS_DIR = "/var/lib/prometheus/node-exporter"
# Installed beside torch: torch.distributed.checkpoint gathers its plan through numpy.
COMPANION_PACKAGES = ("numpy",)
S3_DATASETS = "s3://datasets/"


def training_env_path(platform: ResolvedPlatform) -> str | None:
    version = platform.spec.training.torch_version
    if version is None:
        return None
    return f"{platform.spec.storage.parallel_fs.mount_path}/envs/torch-{version}"


def wheelhouse(platform: ResolvedPlatform) -> str | None:
    if platform.spec.backend == "local":
        return LOCAL_WHEELHOUSE
    return platform.spec.training.wheelhouse


def dataset_sources(platform: ResolvedPlatform) -> list[dict[str, str]]:
    """The stack's datasets with their source as a directory on the nodes: s3://datasets/<path> is under
    <shared path>/datasets/<path> (on aws the FSx data repository association of the datasets bucket)."""
    mount = platform.spec.storage.parallel_fs.mount_path
    result = []
    for item in platform.spec.datasets:
        source = item.source
        if source.startswith(S3_DATASETS):
            source = f"{mount}/datasets/{source.removeprefix(S3_DATASETS).strip('/')}"
        result.append({"name": item.name, "version": item.version, "source": source.rstrip("/") or "/"})
    return result


def training_vars(
    platform: ResolvedPlatform,
    *,
    packages: Sequence[str] = COMPANION_PACKAGES,
    registry_url: str | None = None,
) -> dict[str, Any]:
    """`packages`: installed beside torch; `registry_url`: the model registry as the nodes reach it, handed
    to every task as MLFLOW_TRACKING_URI (MLflow's client reads it: mlflow/environment_variables.py)."""
    training = platform.spec.training
    # Slurm's TaskProlog sets these in every task, the batch script included (slurmstepd's exec_task runs
    # it for batch steps too: src/slurmd/slurmstepd/task.c:448 at slurm-22-05-8-1, :450 at slurm-24-11-5-1),
    # so a job finds the platform however it was submitted; /etc/profile.d reaches login shells only.
    task_environment = {
        "GPUPLAT_CHECKPOINT_EVERY": str(training.checkpoint_every_steps),
        "GPUPLAT_JOB_METRICS_DIR": JOB_METRICS_DIR,
        "GPUPLAT_SHARED_PATH": platform.spec.storage.parallel_fs.mount_path,
        "GPUPLAT_CHECKPOINT_PATH": platform.spec.storage.checkpoint_path,
    }
    if registry_url is not None:
        task_environment["MLFLOW_TRACKING_URI"] = registry_url
    values: dict[str, Any] = {
        "slurm_compute_shm_percent": training.shm_percent,
        "slurm_compute_datasets": dataset_sources(platform),
    }
    env_path = training_env_path(platform)
    if env_path is not None:
        task_environment["GPUPLAT_TRAINING_ENV"] = env_path
        values |= {
            "training_env_torch_version": training.torch_version,
            "training_env_path": env_path,
            "training_env_packages": list(packages),
            "training_env_wheelhouse": wheelhouse(platform) or "",
        }
    values["slurm_compute_task_environment"] = task_environment
    return values
