"""Whether a launched node can be in service before Slurm gives up on it.

Slurm launches the nodes of an elastic training pool on aws (min_nodes < max_nodes); a node that has not
registered within ResumeTimeout is terminated and its job requeued, so a boot longer than that never
finishes. The expected boot depends on the image (infra/data/boot_times.yaml): a plain OS image installs
the GPU stack at boot, a node image (aws.bake_images, or the stack's own aws.image_id, made with
infra/backends/aws/image_seal.sh) only configures.
"""

from __future__ import annotations

from infra.data.load import boot_times
from infra.data.models import ImageKind
from infra.spec.load import CONFIG_KEY
from infra.spec.models import NodePool, PlatformSpec

Problem = tuple[str, str]


def node_image_kind(spec: PlatformSpec) -> ImageKind:
    return "baked" if spec.aws.bake_images or spec.aws.image_id else "plain"


def launched_by_slurm(spec: PlatformSpec, pool: NodePool) -> bool:
    return (
        spec.backend == "aws"
        and spec.scheduler.kind == "slurm"
        and pool.role == "train"
        and pool.min_nodes < pool.max_nodes
    )


def expected_boot_s(spec: PlatformSpec) -> int:
    return boot_times().seconds(node_image_kind(spec))


def boot_problems(spec: PlatformSpec) -> list[Problem]:
    launched = [p.name for p in spec.pools if launched_by_slurm(spec, p)]
    timeout = spec.scheduler.resume_timeout_s
    boot = expected_boot_s(spec)
    if not launched or boot <= timeout:
        return []
    image = node_image_kind(spec)
    return [
        (
            f"{CONFIG_KEY}.scheduler.resume_timeout_s",
            f"nodes of {', '.join(launched)} boot in about {boot} s from a {image} image "
            f"(infra/data/boot_times.yaml), longer than ResumeTimeout {timeout} s: Slurm would terminate "
            "each one before it joins. Raise scheduler.resume_timeout_s"
            + (" or set aws.bake_images: true" if image == "plain" else ""),
        )
    ]
