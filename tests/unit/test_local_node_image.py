"""Node images of the local backend: which pools get one, and what names an image."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.backends.local import node_image
from infra.backends.local.cluster import BASE_IMAGE
from infra.backends.local.node_image import imaged_pools, node_images
from infra.backends.local.scale import with_running_sizes
from infra.errors import GpuPlatError
from infra.nodes import ansible_content
from infra.nodes.inventory import inventory_documents
from infra.nodes.podman import exists, podman
from infra.platform.resolve import ResolvedPlatform, load_platform


def test_only_pools_that_grow_past_one_node_get_an_image(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    local = shipped_platforms["local"]
    assert [p.name for p in imaged_pools(local)] == ["train"]  # head is a service pool, infer has one node
    [image] = node_images(local, "base-id")
    assert (image.pool, image.node, image.stack) == ("train", "train-0", "local")
    assert image.reference.startswith("localhost/gpuplat-node:local-train-")


def test_scaling_a_pool_keeps_its_image(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    local = shipped_platforms["local"]
    names = {node_images(with_running_sizes(local, {"train": n}), "base-id")[0].reference for n in (1, 2, 3)}
    assert len(names) == 1


def test_the_image_follows_the_base_image_and_the_inventory(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image carries the pool node's whole configuration, so any inventory value may be in it."""
    local = shipped_platforms["local"]
    [image] = node_images(local, "base-id")
    assert node_images(local, "another-base-id")[0].digest != image.digest

    def edited(group: str, name: str, value: object) -> str:
        documents = inventory_documents(local)
        hosts = documents["hosts.yml"]["all"]
        (hosts["children"][group]["vars"] if group != "all" else hosts["vars"])[name] = value
        monkeypatch.setattr(node_image, "inventory_documents", lambda _: documents)
        return node_images(local, "base-id")[0].digest

    assert edited("pool_train", "gpuplat_gpu_count", 4) != image.digest
    assert edited("all", "slurm_default_time_limit", "12:00:00") != image.digest


def test_the_image_follows_the_roles(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    local = shipped_platforms["local"]
    [image] = node_images(local, "base-id")
    files = ansible_content.content_files(node_image.PROJECT_ROOT)
    monkeypatch.setattr(ansible_content, "content_files", lambda root: files[:-1])
    assert node_images(local, "base-id")[0].digest != image.digest


def test_a_training_pool_without_power_saving_is_configured_in_full(write_stack: Callable[..., Path]) -> None:
    """Without an elastic pool slurm.conf's node lines come from the nodes present, so a node could not
    join from an image without the controller's configuration changing."""

    def fixed_size(platform: dict[str, Any]) -> None:
        train = next(p for p in platform["pools"] if p["name"] == "train")
        train.pop("min"), train.pop("max")
        train["count"] = 4

    assert imaged_pools(load_platform(write_stack("local", fixed_size))) == []


class _ImageStore:
    """podman's image store as `images` and `rmi` see it; images in `stuck` survive `rmi`."""

    def __init__(self, images: list[str], stuck: set[str]) -> None:
        self.images, self.stuck = list(images), stuck

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[0] == "images":
            return subprocess.CompletedProcess(args, 0, "\n".join(self.images) + "\n", "")
        assert args[:2] == ("rmi", "--force"), args
        if args[2] in self.stuck:
            return subprocess.CompletedProcess(args, 2, "", f"Error: image {args[2]} is in use")
        self.images.remove(args[2])
        return subprocess.CompletedProcess(args, 0, "", "")


def test_down_fails_naming_a_node_image_podman_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leftover image would make the next `up` start the pool from it instead of baking it anew."""
    kept, gone = "localhost/gpuplat-node:local-train-aaaa", "localhost/gpuplat-node:local-infer-bbbb"
    monkeypatch.setattr(node_image, "podman", _ImageStore([kept, gone], stuck={kept}))
    refusal = rf"did not remove the node images of stack local: {kept} \(.*in use"
    with pytest.raises(GpuPlatError, match=refusal):
        node_image.remove_stack_images("local")

    monkeypatch.setattr(node_image, "podman", _ImageStore([kept, gone], stuck=set()))
    assert node_image.remove_stack_images("local") == [kept, gone]


class _LabelledImageStore:
    """podman's image store with each image's stack and pool labels, as `images --filter label=STACK=...
    --format '... {{index .Labels POOL}}'` and `rmi` see it."""

    def __init__(self, images: dict[str, tuple[str, str]]) -> None:
        self.images = dict(images)
        self.removed: list[str] = []

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[0] == "images":
            (stack,) = [a.split("=", 2)[2] for a in args if a.startswith(f"label={node_image.STACK_LABEL}=")]
            shown = [f"{ref} {pool}" for ref, (of, pool) in self.images.items() if of == stack]
            return subprocess.CompletedProcess(args, 0, "\n".join(shown) + "\n", "")
        assert args[:2] == ("rmi", "--force"), args
        del self.images[args[2]]
        self.removed.append(args[2])
        return subprocess.CompletedProcess(args, 0, "", "")


def test_a_bake_removes_its_pools_older_images_of_its_own_stack_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rmi --force` takes the containers started from an image: a bake of local's train pool removes
    local's older train image, not local's infer image, another stack's train image, or the new one."""
    image = node_image.NodeImage("local", "train", "train-0", "b" * 64)
    older = f"{node_image.NODE_IMAGES}:local-train-{'a' * 16}"
    kept = {
        f"{node_image.NODE_IMAGES}:local-infer-{'c' * 16}": ("local", "infer"),
        f"{node_image.NODE_IMAGES}:other-train-{'d' * 16}": ("other", "train"),
    }
    store = _LabelledImageStore({older: ("local", "train"), **kept})
    monkeypatch.setattr(node_image, "podman", store)
    committed: list[str] = []

    def seal_and_commit(container: str, reference: str, labels: dict[str, str]) -> None:
        store.images[reference] = (labels[node_image.STACK_LABEL], labels[node_image.POOL_LABEL])
        committed.append(reference)

    monkeypatch.setattr(node_image, "seal_and_commit", seal_and_commit)
    node_image.bake(image)
    assert committed == [image.reference]
    assert store.removed == [older]
    assert store.images == {image.reference: ("local", "train"), **kept}


@pytest.mark.containers
@pytest.mark.skipif(
    shutil.which("podman") is None or os.geteuid() != 0 or not exists("image", BASE_IMAGE),
    reason=f"needs root, podman and the base image {BASE_IMAGE} (make image)",
)
def test_a_stacks_pool_images_are_its_own_not_another_stacks(tmp_path: Path) -> None:
    """A bake removes the pool's older images with `rmi --force`, which takes the containers started from
    them: another stack's images of a pool of the same name, and another pool's of this stack, are not
    among them."""
    mine, other = f"test-{uuid.uuid4().hex[:8]}", f"test-{uuid.uuid4().hex[:8]}"
    (tmp_path / "Containerfile").write_text(f"FROM {BASE_IMAGE}\n")
    made = []
    for stack, pool in ((mine, "train"), (mine, "infer"), (other, "train")):
        reference = f"{node_image.NODE_IMAGES}:{stack}-{pool}-0"
        labels = [f"--label={node_image.STACK_LABEL}={stack}", f"--label={node_image.POOL_LABEL}={pool}"]
        podman(
            "build",
            "--quiet",
            "--tag",
            reference,
            *labels,
            "--file",
            str(tmp_path / "Containerfile"),
            str(tmp_path),
        )
        made.append(reference)
    try:
        assert node_image.stack_images(mine, "train") == [made[0]]
        assert sorted(node_image.stack_images(mine)) == sorted(made[:2])
        assert node_image.stack_images(other, "infer") == []
    finally:
        for reference in made:
            podman("rmi", "--force", reference, check=False)
