"""`gpuplat scale` on the local backend: add and remove nodes of an elastic pool of a running cluster.

The same join path as a cloud node: every name a pool may have is in slurm.conf from the start (power
saving, State=CLOUD), so a new node changes no other node's files. A new container starts from the
pool's node image where there is one, gets the cluster's MUNGE key the way a booting cloud node does,
runs its join steps (infra/backends/local/join.py; the whole play without an image), and its slurmd registers
configless: Slurm clears the powered-down state of a node that registers (with
ReturnToService=2) and it takes jobs. Scaling down powers the names down in Slurm (their jobs are
requeued) and removes the containers; the names show as powered down (`idle~`) again.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from infra.backends.local.cluster import LocalCluster
from infra.backends.local.join import join
from infra.backends.local.node_image import available
from infra.errors import ExitCode, GpuPlatError
from infra.nodes.inventory import inventory_documents, write_inventory
from infra.nodes.playbook_run import state_dir
from infra.nodes.podman import podman
from infra.platform.resolve import ResolvedPlatform

_SIZES_FILE = "pool-sizes.json"
_POWER_DOWN_WAIT_S = 60


def _sizes_path(platform: ResolvedPlatform) -> Path:
    return state_dir(platform.name) / _SIZES_FILE


def running_sizes(platform: ResolvedPlatform) -> dict[str, int]:
    """Nodes each elastic pool runs now: its minimum until `gpuplat scale` changed it."""
    path = _sizes_path(platform)
    saved = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {
        p.name: int(saved.get(p.name, p.spec.min_nodes))
        for p in platform.pools
        if p.spec.min_nodes < p.spec.max_nodes
    }


def with_running_sizes(platform: ResolvedPlatform, sizes: dict[str, int] | None = None) -> ResolvedPlatform:
    sizes = running_sizes(platform) if sizes is None else sizes
    pools = tuple(replace(p, running_nodes=sizes.get(p.name)) for p in platform.pools)
    return replace(platform, pools=pools)


def check_request(platform: ResolvedPlatform, pool_name: str, nodes: int) -> None:
    pool = next((p for p in platform.pools if p.name == pool_name), None)
    elastic = [p.name for p in platform.pools if p.spec.min_nodes < p.spec.max_nodes]
    if pool is None or pool.name not in elastic:
        raise GpuPlatError(
            f"--pool {pool_name!r}: stack {platform.name} scales only its elastic pools (min < max): "
            f"{', '.join(elastic) or 'none; give a pool min and max in the stack file'}",
            exit_code=ExitCode.BAD_INPUT,
        )
    if not pool.spec.min_nodes <= nodes <= pool.spec.max_nodes:
        raise GpuPlatError(
            f"--nodes {nodes}: pool {pool.name} runs between {pool.spec.min_nodes} and {pool.spec.max_nodes} "
            "nodes (its min and max in the stack file)",
            exit_code=ExitCode.BAD_INPUT,
        )


def scale_pool(platform: ResolvedPlatform, pool_name: str, nodes: int, inventory: Path) -> str:
    check_request(platform, pool_name, nodes)
    sizes = running_sizes(platform)
    current = sizes[pool_name]
    names = platform.pool(pool_name).node_names()
    if nodes == current:
        return f"pool {pool_name} already runs {nodes} node(s)"
    controller = platform.controller_pool.node_names()[0]
    before = LocalCluster(with_running_sizes(platform, sizes))
    if nodes > current:
        added = names[current:nodes]
        sizes[pool_name] = nodes
        scaled = with_running_sizes(platform, sizes)
        cluster = LocalCluster(scaled)
        cluster.ensure(available(cluster.node_images()), [cluster.node(name) for name in added])
        write_inventory(inventory_documents(scaled), inventory)
        join(cluster, added, inventory)
        _save(platform, sizes)
        return f"pool {pool_name}: added {', '.join(added)}"
    removed = names[nodes:current]
    before.exec(
        controller, "scontrol", "update", f"nodename={','.join(removed)}", "state=power_down_force",
        "reason=gpuplat scale",
    )  # fmt: skip
    _wait_powered_down(before, controller, removed)
    for name in removed:
        podman("rm", "--force", "--time", "5", before.node(name).container)
    sizes[pool_name] = nodes
    _save(platform, sizes)
    write_inventory(inventory_documents(with_running_sizes(platform, sizes)), inventory)
    return f"pool {pool_name}: removed {', '.join(removed)} (Slurm shows them powered down)"


def _wait_powered_down(cluster: LocalCluster, controller: str, names: list[str]) -> None:
    deadline = time.monotonic() + _POWER_DOWN_WAIT_S
    states = ""
    while time.monotonic() < deadline:
        states = cluster.exec_unchecked(controller, "sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%T")
        if states.split() and all(state.endswith("~") for state in states.split()):
            return
        time.sleep(2)
    raise GpuPlatError(
        f"Slurm did not power down {', '.join(names)} in {_POWER_DOWN_WAIT_S} s (states: {states!r})"
    )


def _save(platform: ResolvedPlatform, sizes: dict[str, int]) -> None:
    path = _sizes_path(platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sizes, sort_keys=True), encoding="utf-8")


def forget_sizes(platform: ResolvedPlatform) -> None:
    _sizes_path(platform).unlink(missing_ok=True)
