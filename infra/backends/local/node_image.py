"""Node images of the local backend: a pool's node configured once, so that its other nodes only join.

The same mechanism as a cloud pool's baked image (infra/backends/aws/node_image.py, and the bake in the
cloud in a box): the pool's first node is configured by `playbooks/site.yml` like any node, then a copy
of it is sealed by image_seal.sh (what belongs to one machine goes: its MUNGE key, Slurm's state, the
machine id; munge and slurmd are disabled) and committed as a podman image. Every other node of the
pool starts from that image and runs only the steps tagged `join` (its key, its health check, its
services), so eight nodes cost little more than two on the same cores.

An image is named by a digest of everything its content follows from: the base image, the project's
Ansible content, the seal and the stack's inventory (computed without the running sizes, so scaling a
pool keeps its image). A change to any of them makes a new image the next time the pool's first node is
configured; `gpuplat down` removes the stack's images.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from infra.errors import GpuPlatError
from infra.nodes.ansible_content import digest_content
from infra.nodes.inventory import container_name, inventory_documents
from infra.nodes.podman import exists, podman
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.scheduling.slurm import power_saving
from infra.spec.load import PROJECT_ROOT

NODE_IMAGES = "localhost/gpuplat-node"
IMAGE_SEAL = PROJECT_ROOT / "infra" / "backends" / "aws" / "image_seal.sh"
STACK_LABEL, POOL_LABEL, DIGEST_LABEL = "gpuplat.stack", "gpuplat.pool", "gpuplat.node-image"


@dataclass(frozen=True)
class NodeImage:
    stack: str
    pool: str
    node: str  # the pool's first node: configured in full, then baked
    digest: str

    @property
    def reference(self) -> str:
        return f"{NODE_IMAGES}:{self.stack}-{self.pool}-{self.digest[:16]}"


def imaged_pools(platform: ResolvedPlatform) -> list[ResolvedPool]:
    """Pools of more than one node (for one node the image would only add a bake) whose nodes may join
    without the others' configuration changing: inference pools (the gateway's and Prometheus's node
    lists are refreshed after a join, infra/backends/local/join.py) and, with power saving, training pools
    (slurm.conf names every node a pool may have from the start; without it the controller's node
    lines come from the nodes present)."""
    eligible = {"infer", "train"} if power_saving(platform) else {"infer"}
    return [p for p in platform.pools if p.role in eligible and len(p.node_names()) > 1]


def node_images(platform: ResolvedPlatform, base_image_id: str) -> list[NodeImage]:
    declared = replace(platform, pools=tuple(replace(p, running_nodes=None) for p in platform.pools))
    digest = hashlib.sha256(base_image_id.encode())
    digest_content(digest, PROJECT_ROOT, [IMAGE_SEAL])
    digest.update(json.dumps(inventory_documents(declared), sort_keys=True, default=str).encode())
    return [
        NodeImage(
            platform.name,
            pool.name,
            pool.node_names()[0],
            hashlib.sha256(digest.digest() + pool.name.encode()).hexdigest(),
        )
        for pool in imaged_pools(platform)
    ]


def seal_and_commit(container: str, image: str, labels: dict[str, str]) -> None:
    """Commit the container, run image_seal.sh on a copy outside systemd (no network, its own
    /etc/hostname), commit that as `image`; the snapshot and the sealing container are removed."""
    snapshot, sealer = f"{image}-snapshot", f"{container}-seal"
    podman("rm", "--force", sealer, check=False)
    podman("commit", "--quiet", container, snapshot)
    try:
        podman(
            "run", "--name", sealer, "--privileged", "--no-hosts", "--network", "none",
            "--volume", f"{IMAGE_SEAL}:/run/image_seal.sh:ro", snapshot,
            "sh", "-c", "umount /etc/hostname && bash /run/image_seal.sh",
        )  # fmt: skip
        label_args = [arg for key, value in labels.items() for arg in ("--change", f"LABEL {key}={value}")]
        podman("commit", "--quiet", *label_args, sealer, image)
    finally:
        podman("rm", "--force", sealer, check=False)
        podman("rmi", "--force", snapshot, check=False)


def bake(image: NodeImage) -> None:
    """The pool's image from its first node, configured and running; the stack's older ones go."""
    labels = {STACK_LABEL: image.stack, POOL_LABEL: image.pool, DIGEST_LABEL: image.digest}
    seal_and_commit(container_name(image.stack, image.node), image.reference, labels)
    for older in stack_images(image.stack, image.pool):
        if older != image.reference:
            podman("rmi", "--force", older, check=False)


def stack_images(stack: str, pool: str | None = None) -> list[str]:
    """The stack's node images (of one pool, where given). One label filter only: podman 4.3 joins two
    `--filter label=` with OR (stack or pool), which named every stack's images of the pool, and a bake's
    `rmi --force` of them removed another stack's nodes started from them."""
    shown = f'{{{{.Repository}}}}:{{{{.Tag}}}} {{{{index .Labels "{POOL_LABEL}"}}}}'
    listed = podman("images", "--filter", f"label={STACK_LABEL}={stack}", "--format", shown, check=False)
    found = [line.split() for line in listed.stdout.splitlines()]
    return [
        fields[0]
        for fields in found
        if fields and fields[0].startswith(NODE_IMAGES) and (pool is None or fields[1:] == [pool])
    ]


def remove_stack_images(stack: str) -> list[str]:
    """Remove the stack's node images; an image podman keeps fails, so `down` never reports a clean
    host while the next `up` would start the pool from a leftover."""
    removed = stack_images(stack)
    errors = [podman("rmi", "--force", image, check=False).stderr.strip() for image in removed]
    left = stack_images(stack)
    if left:
        reasons = "; ".join(e for e in errors if e) or "no error from podman"
        raise GpuPlatError(
            f"podman did not remove the node images of stack {stack}: {', '.join(left)} ({reasons}). "
            f"Remove them with `podman rmi --force {' '.join(left)}`, then run `gpuplat down` again."
        )
    return removed


def available(images: list[NodeImage]) -> dict[str, str]:
    """Pool -> image reference, for the images that exist."""
    return {i.pool: i.reference for i in images if exists("image", i.reference)}
