"""A node joins a running local cluster: the cluster's MUNGE key provisioned on it, the way a booting
cloud node fetches its own, then `site.yml` on it alone. A node started from its pool's image
(infra/backends/local/node_image.py) runs only the steps tagged `join`; any other node runs the whole play.
Then the roles whose configuration lists the nodes (Prometheus's scrape targets, the gateway's model
servers) run again on their hosts, so the new nodes are scraped and served from."""

from __future__ import annotations

import tempfile
from pathlib import Path

from infra.backends.local.cluster import LocalCluster
from infra.nodes.playbook_run import PlaybookRun, ProgressCallback, run_playbook, state_dir
from infra.nodes.podman import podman

NODE_MUNGE_KEY = "/etc/gpuplat/munge.key"
JOIN_TAGS = ["join"]
# Roles (and the inventory groups of their hosts) whose configuration names every node of a group.
NODE_LIST_ROLES = ["monitoring", "inference_gateway"]


def provision_munge_key(cluster: LocalCluster, names: list[str]) -> None:
    controller = cluster.platform.controller_pool.node_names()[0]
    with tempfile.TemporaryDirectory() as scratch:
        key = Path(scratch) / "munge.key"
        podman("cp", f"{cluster.node(controller).container}:/etc/munge/munge.key", str(key))
        for name in names:
            container = cluster.node(name).container
            podman("exec", container, "install", "-d", "-m", "0755", str(Path(NODE_MUNGE_KEY).parent))
            podman("cp", str(key), f"{container}:{NODE_MUNGE_KEY}")
            podman("exec", container, "chmod", "0400", NODE_MUNGE_KEY)


def join(
    cluster: LocalCluster, names: list[str], inventory: Path, on_progress: ProgressCallback | None = None
) -> PlaybookRun:
    """Provision the key on `names`, then run their part of site.yml: the join steps on nodes started
    from an image, everything on the others."""
    provision_munge_key(cluster, names)
    imaged = [n for n in names if cluster.started_from_image(cluster.node(n))]
    whole = [n for n in names if n not in imaged]
    logs = state_dir(cluster.platform.name) / "logs"
    variables = {"munge_key_file": NODE_MUNGE_KEY}
    run = PlaybookRun("site.yml", 0, [], logs / "join.log")
    if whole:
        run = run_playbook(
            "site.yml", inventory, logs, limit=whole, extra_vars=variables, on_progress=on_progress,
            containers=True,
        )  # fmt: skip
    if imaged:
        joined = run_playbook(
            "site.yml", inventory, logs, limit=imaged, tags=JOIN_TAGS, extra_vars=variables,
            log_name="join.log", on_progress=on_progress, containers=True,
        )  # fmt: skip
        run = PlaybookRun("site.yml", run.changed + joined.changed, [], joined.log)
    listed = run_playbook(
        "site.yml", inventory, logs, limit=NODE_LIST_ROLES, tags=NODE_LIST_ROLES,
        log_name="node-lists.log", on_progress=on_progress, containers=True,
    )  # fmt: skip
    return PlaybookRun("site.yml", run.changed + listed.changed, [], run.log)
