"""`gpuplat up`: machines, inventory, playbooks, validation; timed phase by phase.

local: podman containers (infra/backends/local); cloud stacks: `pulumi up` through the Automation API.
Both then write the inventory, run playbooks/site.yml and validate what applies.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra.backends.local.cluster import LocalCluster
from infra.backends.local.join import join
from infra.backends.local.node_image import available, bake
from infra.backends.local.scale import running_sizes, with_running_sizes
from infra.backends.local.status import PlatformStatus, collect_status, parse_sinfo
from infra.errors import GpuPlatError
from infra.lifecycle import cloud_stack, fleet
from infra.nodes.ansible_content import digest_content
from infra.nodes.inventory import (
    has_ansible_nodes,
    inventory_documents,
    stack_inventory_documents,
    write_inventory,
)
from infra.nodes.playbook_run import ProgressCallback, inventory_dir, playbook_log, run_playbook, state_dir
from infra.platform.resolve import ResolvedPlatform
from infra.scheduling.slurm import default_partition, partition_names
from infra.spec.load import PROJECT_ROOT

# `idle~`: a powered-down node of an elastic pool, ready to be started.
_HEALTHY_NODE_STATES = {"idle", "mixed", "allocated", "completing", "idle~"}


@dataclass(frozen=True)
class PhaseTiming:
    name: str
    seconds: float
    summary: str


@dataclass
class UpResult:
    stack: str
    phases: list[PhaseTiming] = field(default_factory=list)
    changes: int = 0
    status: PlatformStatus | None = None


PhaseStart = Callable[[str, str], None]
PhaseDone = Callable[[PhaseTiming], None]


class _Phases:
    def __init__(self, result: UpResult, on_start: PhaseStart, on_done: PhaseDone) -> None:
        self.result, self.on_start, self.on_done = result, on_start, on_done

    def run(self, name: str, step: Callable[[], str], hint: str = "") -> None:
        self.on_start(name, hint)
        start = time.perf_counter()
        summary = step()
        timing = PhaseTiming(name, time.perf_counter() - start, summary)
        self.result.phases.append(timing)
        self.on_done(timing)


def validate_local(cluster: LocalCluster) -> str:
    platform = cluster.platform
    controller = platform.controller_pool.node_names()[0]
    if not cluster.exec_unchecked(controller, "sh", "-c", "command -v sinfo").strip():
        return "Slurm not installed on the controller: scheduler checks skipped"
    sinfo = cluster.exec_unchecked(controller, "sinfo", "-h", "-o", "%P|%a|%D|%G|%T")
    lines = parse_sinfo(sinfo)
    expected = partition_names(platform)
    missing = expected - {line.name for line in lines}
    unhealthy = [
        f"{line.name}:{line.node_states}" for line in lines if line.node_states not in _HEALTHY_NODE_STATES
    ]
    if missing or unhealthy:
        raise GpuPlatError(
            f"Slurm validation failed on {controller}: missing partitions {sorted(missing) or 'none'}, "
            f"unhealthy nodes {unhealthy or 'none'}; sinfo said:\n{sinfo.strip()}"
        )
    partition = default_partition(platform)
    srun = ["srun", "--partition", partition, "--nodes", "1", "--gres", "gpu:1", "--time", "2"]
    job = cluster.exec_unchecked(
        controller, "timeout", "120", *srun, "sh", "-c", "echo $(hostname) $CUDA_VISIBLE_DEVICES"
    )
    if not job.strip():
        raise GpuPlatError(f"a test job with --gres=gpu:1 on partition {partition} printed nothing")
    return (
        f"{len(expected)} partition(s) healthy; test job ran on {job.split()[0]} with GPU {job.split()[-1]}"
    )


def configuration_fingerprint(inventory_text: str, machine_ids: list[str]) -> str:
    """What the playbooks' outcome depends on: the inventory, every file of playbooks/ and roles/, and
    the machines themselves (a recreated container has a new id)."""
    digest = hashlib.sha256(inventory_text.encode())
    digest_content(digest, PROJECT_ROOT, [PROJECT_ROOT / "ansible.cfg"])
    for machine in machine_ids:
        digest.update(machine.encode())
    return digest.hexdigest()


def validate_serving(cluster: LocalCluster) -> str:
    """One embeddings request through the gateway, from this host to the project's own container."""
    url, serving = cluster.gateway_url(), cluster.platform.spec.serving
    if url is None or serving is None:
        return "no serving configured"
    body = json.dumps({"model": serving.model, "input": "gpu-platform validation"}).encode()
    request = urllib.request.Request(
        f"{url}/embeddings", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
    except (OSError, ValueError) as exc:
        raise GpuPlatError(
            f"the inference gateway at {url} did not answer an embeddings request: {exc}"
        ) from exc
    dimensions = len(answer["data"][0]["embedding"])
    return f"gateway {url} answered with a {dimensions}-dimensional embedding"


def up_local(
    platform: ResolvedPlatform,
    on_start: PhaseStart,
    on_done: PhaseDone,
    reconfigure: bool = False,
    on_progress: ProgressCallback | None = None,
) -> UpResult:
    """machines, inventory, configure, node images, join, validate. A pool with a node image
    (infra/backends/local/node_image.py) whose image is missing starts only its first node, which `configure`
    sets up in full and `node images` bakes; its other nodes then start from the image and only join.
    Where the image exists every node of the pool starts from it and joins."""
    platform = with_running_sizes(platform)
    result = UpResult(platform.name)
    phases = _Phases(result, on_start, on_done)
    cluster = LocalCluster(platform)
    stamp = state_dir(platform.name) / "converged.sha256"
    images = cluster.node_images()
    ready = available(images)
    missing = [i for i in images if i.pool not in ready]
    bakers = {i.node for i in missing}
    later = [n for n in cluster.nodes if n.pool in {i.pool for i in missing} and n.name not in bakers]
    state: dict[str, Any] = {"converged": False, "joining": [n.name for n in later]}

    def machines() -> str:
        changed = cluster.ensure(ready, [n for n in cluster.nodes if n not in later])
        result.changes += len(changed)
        return f"{len(cluster.nodes) - len(later)} nodes; " + (
            ", ".join(changed) if changed else "no changes"
        )

    # Until its image is baked, a pool's inventory holds only the node it is baked from: the plays
    # address every node of the inventory, and the others do not exist yet.
    first_wave = with_running_sizes(
        platform, {**running_sizes(platform), **dict.fromkeys((i.pool for i in missing), 1)}
    )

    def inventory() -> str:
        written = write_inventory(
            inventory_documents(first_wave if later else platform), inventory_dir(platform.name)
        )
        return ", ".join(str(p) for p in written) + (
            " (the pools' first nodes until their images are baked)" if later else ""
        )

    def fingerprint() -> str:
        inventory_text = yaml.safe_dump(inventory_documents(platform)["hosts.yml"], sort_keys=False)
        return configuration_fingerprint(inventory_text, cluster.machine_ids())

    def configure() -> str:
        if not reconfigure and stamp.exists() and stamp.read_text(encoding="utf-8").strip() == fingerprint():
            state["converged"] = True
            return (
                "skipped: inventory, playbooks, roles and machines unchanged since the last converge "
                "(--reconfigure runs the playbooks anyway)"
            )
        stamp.unlink(missing_ok=True)
        running = [n for n in cluster.nodes if n not in later]
        whole = [n.name for n in running if reconfigure or not cluster.started_from_image(n)]
        state["joining"] += [n.name for n in running if n.name not in whole]
        run = run_playbook(
            "site.yml",
            inventory_dir(platform.name),
            state_dir(platform.name) / "logs",
            limit=None if len(whole) == len(cluster.nodes) else whole,
            on_progress=on_progress,
            containers=True,
        )
        result.changes += run.changed
        return f"{run.changed} task(s) changed on {len(whole)} node(s); log {run.log}"

    def bake_images() -> str:
        if state["converged"] or not images:
            return "no image to bake" if not images else "skipped: converged"
        for image in missing:
            bake(image)
            result.changes += 1
        found = available(images)
        return "; ".join(f"{pool}: {reference}" for pool, reference in found.items())

    def join_nodes() -> str:
        if state["converged"]:
            return "skipped: converged"
        if later:
            result.changes += len(cluster.ensure(available(images), later))
            write_inventory(inventory_documents(platform), inventory_dir(platform.name))
        joining = sorted(state["joining"])
        if joining:
            run = join(cluster, joining, inventory_dir(platform.name), on_progress)
            result.changes += run.changed
        stamp.write_text(fingerprint(), encoding="utf-8")
        return f"{', '.join(joining)} joined from their pool's image" if joining else "no node to join"

    phases.run("machines", machines)
    phases.run("inventory", inventory)
    phases.run("configure", configure, f"log: {playbook_log(state_dir(platform.name) / 'logs', 'site.yml')}")
    phases.run("node images", bake_images)
    phases.run("join", join_nodes, f"log: {state_dir(platform.name) / 'logs' / 'join.log'}")
    phases.run("validate", lambda: f"{validate_local(cluster)}; {validate_serving(cluster)}")
    result.status = collect_status(cluster)
    return result


@dataclass(frozen=True)
class CloudApproval:
    """How `up` on a cloud stack reports Pulumi's lines and gets the preview approved."""

    on_line: cloud_stack.Line
    yes: bool = False
    ask: cloud_stack.Ask | None = None


def up_cloud(
    platform: ResolvedPlatform,
    on_start: PhaseStart,
    on_done: PhaseDone,
    approval: CloudApproval,
    on_progress: ProgressCallback | None = None,
) -> UpResult:
    """preview (shown, then approved), pulumi up, inventory from the stack's outputs, configure, validate."""
    result = UpResult(platform.name)
    phases = _Phases(result, on_start, on_done)
    outputs: dict[str, Any] = {}
    stack = cloud_stack.open_stack(platform, "`gpuplat up`", create=True)
    changes: list[cloud_stack.Changes] = []

    def preview() -> str:
        changes.append(cloud_stack.preview(stack, approval.on_line))
        return changes[0].line()

    def machines() -> str:
        if changes[0].changing:
            cloud_stack.approve(
                f"pulumi up on stack {platform.name}: {changes[0].line()}", yes=approval.yes, ask=approval.ask
            )
        outputs.update(cloud_stack.apply(stack, approval.on_line))
        result.changes += changes[0].changing
        started = fleet.start_fleet(platform)
        return f"{changes[0].changing} resource change(s); {len(outputs)} stack outputs; {started}"

    phases.run("preview", preview, "pulumi preview --diff against what is deployed")
    phases.run("pulumi up", machines)
    if not has_ansible_nodes(platform):
        return result

    def inventory() -> str:
        # The stack's outputs (FSx mount source, controller addresses, SSM bucket), not the offline view.
        documents = stack_inventory_documents(platform, outputs)
        return ", ".join(str(p) for p in write_inventory(documents, inventory_dir(platform.name)))

    def configure() -> str:
        run = run_playbook(
            "site.yml",
            inventory_dir(platform.name),
            state_dir(platform.name) / "logs",
            limit=fleet.configure_limit(platform),
            on_progress=on_progress,
        )
        result.changes += run.changed
        return f"{run.changed} task(s) changed"

    phases.run("inventory", inventory)
    phases.run("configure", configure)
    if platform.spec.scheduler.kind == "slurm":

        def validate() -> str:
            from infra.validate.run import ValidateOptions
            from infra.validate.run import validate as validate_cluster

            report = validate_cluster(platform, ValidateOptions())
            failing = ", ".join(f"{node} ({reason})" for node, reason in report.failing_nodes.items())
            verdict = "passed" if report.passed else f"FAILED{': ' + failing if failing else ''}"
            return f"{verdict}; report {report.results_dir.parent / 'report.json'} (gpuplat validate)"

        phases.run("validate", validate)
    return result


def up(
    platform: ResolvedPlatform,
    on_start: PhaseStart,
    on_done: PhaseDone,
    approval: CloudApproval,
    reconfigure: bool = False,
    on_progress: ProgressCallback | None = None,
) -> UpResult:
    if platform.spec.backend == "local":
        return up_local(platform, on_start, on_done, reconfigure, on_progress)
    return up_cloud(platform, on_start, on_done, approval, on_progress)
