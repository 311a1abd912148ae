"""The `local` backend's machines: one systemd container per node on a podman network, a shared volume
standing in for the parallel filesystem, and simulated GPU device files (NVIDIA's character major 195)
so Slurm can account GPUs. Everything above the machines is the real software, installed by Ansible.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infra.backends.local.host_caches import environment_archives_dir
from infra.backends.local.node_image import NODE_IMAGES, NodeImage, node_images, remove_stack_images
from infra.backends.local.wheelhouse import ensure_wheelhouse
from infra.errors import EnvironmentProblem, GpuPlatError
from infra.nodes.addresses import local_node_addresses, registry_address, stack_subnet
from infra.nodes.at_once import at_once
from infra.nodes.inventory import LOCAL_NODE_CA_BUNDLE, container_name
from infra.nodes.podman import exists, inspect, podman, wait_systemd
from infra.platform.resolve import ResolvedPlatform
from infra.training.job_env import LOCAL_ENVIRONMENT_ARCHIVES, LOCAL_WHEELHOUSE

BASE_IMAGE = "localhost/gpuplat-base:bookworm"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NVIDIA_CHAR_MAJOR = 195
GATEWAY_PORT = 8080  # roles/inference_gateway
PROMETHEUS_PORT = 9090  # roles/monitoring
_BOOT_TIMEOUT_S = 300


@dataclass(frozen=True)
class LocalNode:
    name: str
    pool: str
    role: str
    container: str
    gpus: int
    address: str


@dataclass(frozen=True)
class NodeState:
    node: LocalNode
    state: str
    address: str


def host_memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise EnvironmentProblem("/proc/meminfo has no MemTotal line: cannot size the nodes' /dev/shm")


class LocalCluster:
    def __init__(self, platform: ResolvedPlatform, image: str = BASE_IMAGE) -> None:
        if platform.spec.backend != "local":
            raise GpuPlatError(f"stack {platform.name} has backend {platform.spec.backend}, not local")
        self.platform = platform
        self.image = image
        self.network = f"gpuplat-{platform.name}"
        self.volume = f"gpuplat-{platform.name}-shared"
        self.subnet = stack_subnet(platform.name)
        addresses = local_node_addresses(platform)
        # Every node a pool may have, each with its fixed address; `nodes` are those running now.
        self.possible_nodes = [
            LocalNode(
                node,
                pool.name,
                pool.role,
                container_name(platform.name, node),
                pool.gpus_per_node,
                addresses[node],
            )
            for pool in platform.pools
            for node in pool.node_names()
        ]
        running = {node for pool in platform.pools for node in pool.running_node_names()}
        self.nodes = [n for n in self.possible_nodes if n.name in running]

    def node(self, name: str) -> LocalNode:
        return next(n for n in self.possible_nodes if n.name == name)

    def require_base_image(self) -> None:
        if not exists("image", self.image):
            raise EnvironmentProblem(
                f"base image {self.image} is missing: build it with scripts/build-base-image.sh "
                "(make up does)."
            )

    def node_images(self) -> list[NodeImage]:
        """The node image each imaged pool's nodes start from (infra/backends/local/node_image.py)."""
        self.require_base_image()
        base = inspect("image", self.image) or {}
        return node_images(self.platform, str(base.get("Id", self.image)))

    def started_from_image(self, node: LocalNode) -> bool:
        info = inspect("container", node.container) or {}
        return str(info.get("ImageName", "")).startswith(NODE_IMAGES)

    def ensure(self, pool_images: Mapping[str, str], nodes: list[LocalNode] | None = None) -> list[str]:
        """Create what is missing, start what is stopped, of `nodes` (default: every running node);
        return what changed (empty when converged). Nodes of a pool in `pool_images` start from it."""
        self.require_base_image()
        nodes = self.nodes if nodes is None else nodes
        changed: list[str] = []
        network = inspect("network", self.network)
        if network is None:
            podman("network", "create", "--subnet", str(self.subnet), self.network)
            changed.append(f"network {self.network}")
        elif str(self.subnet) not in str(network.get("subnets", "")):
            raise GpuPlatError(
                f"podman network {self.network} exists with another subnet than {self.subnet}: "
                f"run `gpuplat down --stack {self.platform.name}` first"
            )
        if not exists("volume", self.volume):
            podman("volume", "create", self.volume)
            changed.append(f"volume {self.volume}")
        mount = self.platform.spec.storage.parallel_fs.mount_path
        # Nodes reach each other by inventory name (Slurm) and by container name (the ansible_host
        # that the gateway and Prometheus address them by).
        hosts = [
            arg
            for n in self.possible_nodes
            for name in (n.name, n.container)
            for arg in ("--add-host", f"{name}:{n.address}")
        ]
        # /dev/shm as the training nodes' fstab line sizes it on a machine that boots (podman's is 64 MiB).
        shm_mib = host_memory_mib() * self.platform.spec.training.shm_percent // 100
        wheels = ensure_wheelhouse(self.platform)
        for node in nodes:
            # The environments installed from the wheels are archived by the node that installs, each
            # node in a folder of its own.
            wheel_mount = (
                [
                    "--volume", f"{wheels}:{LOCAL_WHEELHOUSE}:ro",
                    "--volume",
                    f"{environment_archives_dir(self.platform.name, node.name)}:{LOCAL_ENVIRONMENT_ARCHIVES}",
                ]
                if wheels
                else []
            )  # fmt: skip
            info = inspect("container", node.container)
            if info is None:
                podman(
                    "run", "--detach", "--name", node.container, "--hostname", node.name,
                    "--network", self.network, "--ip", node.address, *hosts,
                    "--systemd=always", "--privileged", "--shm-size", f"{shm_mib}m",
                    "--volume", f"{self.volume}:{mount}", *wheel_mount,
                    "--label", f"gpuplat.stack={self.platform.name}", "--label", f"gpuplat.pool={node.pool}",
                    pool_images.get(node.pool, self.image), "/sbin/init",
                )  # fmt: skip
                changed.append(f"container {node.container}")
            elif not info["State"]["Running"]:
                podman("start", node.container)
                changed.append(f"started {node.container}")
        # The nodes at once: three `podman exec` each made most of this phase's 2 s in a `gpuplat up` that
        # finds the four nodes running.
        for settled in at_once(_settle, nodes):
            changed += settled
        return changed

    def gateway_url(self) -> str | None:
        if self.platform.spec.serving is None:
            return None
        return f"http://{self._gateway_address()}:{GATEWAY_PORT}/v1"

    def registry_url(self) -> str | None:
        """The model registry on the gateway's node (serving.registry), None where the stack runs none."""
        return registry_address(self.platform)

    def _gateway_address(self) -> str:
        gateway = self.platform.gateway_pool.node_names()[0]
        return next(n.address for n in self.nodes if n.name == gateway)

    def prometheus_url(self) -> str:
        monitor = self.platform.controller_pool.node_names()[0]
        address = next(n.address for n in self.nodes if n.name == monitor)
        return f"http://{address}:{PROMETHEUS_PORT}"

    def states(self) -> list[NodeState]:
        result = []
        for node in self.nodes:
            info = inspect("container", node.container)
            if info is None:
                result.append(NodeState(node, "absent", "-"))
                continue
            networks = info.get("NetworkSettings", {}).get("Networks", {}) or {}
            address = networks.get(self.network, {}).get("IPAddress", "-")
            result.append(NodeState(node, info["State"]["Status"], address or "-"))
        return result

    def machine_ids(self) -> list[str]:
        return [str((inspect("container", n.container) or {}).get("Id", "")) for n in self.nodes]

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        container = container_name(self.platform.name, node)
        return podman("exec", container, *command, timeout=timeout).stdout

    def exec_unchecked(self, node: str, *command: str, timeout: float = 60) -> str:
        """stdout of a command that may fail (a service not installed yet, Slurm still starting)."""
        container = container_name(self.platform.name, node)
        return podman("exec", container, *command, check=False, timeout=timeout).stdout

    def destroy(self) -> list[str]:
        removed: list[str] = []
        for node in self.possible_nodes:
            if exists("container", node.container):
                podman("rm", "--force", "--time", "5", node.container)
                removed.append(node.container)
        if exists("network", self.network):
            podman("network", "rm", "--force", self.network)
            removed.append(self.network)
        if exists("volume", self.volume):
            podman("volume", "rm", "--force", self.volume)
            removed.append(self.volume)
        removed += remove_stack_images(self.platform.name)
        return removed


def _settle(node: LocalNode, stop: threading.Event) -> list[str]:
    """Wait for the node's systemd, then give it what it needs from the host; what changed on it."""
    wait_systemd(node.container, _BOOT_TIMEOUT_S, stop)
    changed = []
    if node.gpus and simulate_gpus(node.container, node.gpus):
        changed.append(f"simulated GPUs on {node.name}")
    if share_host_ca(node.container):
        changed.append(f"host CA bundle on {node.name}")
    return changed


def share_host_ca(container: str) -> bool:
    """The host's CA bundle on the node (pip behind a TLS-inspecting proxy); True if it was copied."""
    if not HOST_CA_BUNDLE.exists():
        return False
    present = podman("exec", container, "sha256sum", LOCAL_NODE_CA_BUNDLE, check=False).stdout.split()
    wanted = hashlib.sha256(HOST_CA_BUNDLE.read_bytes()).hexdigest()
    if present and present[0] == wanted:
        return False
    podman("exec", container, "mkdir", "-p", str(Path(LOCAL_NODE_CA_BUNDLE).parent))
    podman("cp", str(HOST_CA_BUNDLE), f"{container}:{LOCAL_NODE_CA_BUNDLE}")
    return True


def simulate_gpus(container: str, gpus: int) -> bool:
    """Device files /dev/nvidia0.. and /dev/nvidiactl with NVIDIA's major number; True if any was made."""
    make = f"mknod -m 666 /dev/nvidia$i c {NVIDIA_CHAR_MAJOR}"
    script = (
        f"changed=0; for i in $(seq 0 {gpus - 1}); do "
        f"[ -e /dev/nvidia$i ] || {{ {make} $i; changed=1; }}; done; "
        f"i=ctl; [ -e /dev/nvidiactl ] || {{ {make} 255; changed=1; }}; "
        "echo $changed"
    )
    return podman("exec", container, "sh", "-c", script).stdout.strip() == "1"
