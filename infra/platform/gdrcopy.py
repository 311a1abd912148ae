"""GDRCopy on the GPU nodes of an RDMA fabric: which release they build, and whether it fits them.

The RDMA pools (fabric efa, infiniband or roce; their training GPU nodes) get GDRCopy's library and its
kernel module gdrdrv (roles/rdma); other pools get nothing. The release is data (infra/data/packages.yaml,
gdrcopy) and must support the CUDA major the driver reports and every GPU architecture of those pools;
gdrdrv itself is rebuilt against the pinned driver's source whenever the driver or the kernel changes
(roles/rdma/files/gpuplat-gdrdrv-build.sh).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra.data.packages import Gdrcopy

Problem = tuple[str, str]
RDMA_FABRICS = frozenset({"efa", "infiniband", "roce"})


@dataclass(frozen=True)
class GdrcopyBuild:
    version: str
    commit: str
    repository: str


def resolve_gdrcopy(
    facts: Gdrcopy, fabric: str, driver_cuda_major: int, architectures: Sequence[str], path: str
) -> tuple[GdrcopyBuild | None, list[Problem]]:
    """The GDRCopy the nodes build where the fabric is RDMA and the pools have GPUs; a problem where the
    release in the data does not support the driver's CUDA major or one of the GPU architectures."""
    if fabric not in RDMA_FABRICS or not architectures:
        return None, []
    problems: list[Problem] = []
    if driver_cuda_major not in facts.cuda_majors:
        problems.append(
            (
                path,
                f"GDRCopy {facts.version} (infra/data/packages.yaml, gdrcopy) supports CUDA "
                f"{', '.join(map(str, facts.cuda_majors))}, and the driver reports CUDA {driver_cuda_major}: "
                f"the {fabric} pools need a GDRCopy release that supports it; record one in the data or pick "
                "an older software.driver_branch",
            )
        )
    unsupported = sorted(set(architectures) - set(facts.architectures))
    if unsupported:
        problems.append(
            (
                path,
                f"GDRCopy {facts.version} (infra/data/packages.yaml, gdrcopy) does not support "
                f"{', '.join(unsupported)} GPUs (it supports {', '.join(facts.architectures)}): the {fabric} "
                "pools need a GDRCopy release that does; record one in the data",
            )
        )
    if problems:
        return None, problems
    return GdrcopyBuild(facts.version, facts.commit, facts.repository), []
