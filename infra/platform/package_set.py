"""The exact packages the node roles install for a resolved software set, and what the facts say of each.

`gpuplat plan` lists the ones a stack rests on that were never seen in the real repository index
(`verified: false` in infra/data/packages.yaml): a fixture built from the same table proves nothing about
them. A shipped stack may rest on such a fact only where the entry says why (`accepted`).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.data.packages import PackageFacts, upstream_version
from infra.platform.versions import SoftwareVersions


@dataclass(frozen=True)
class RestingFact:
    package: str
    version: str  # the upstream version the roles pin, or the exact string where the build matters
    listed: bool  # the facts list the package at that version for the release
    verified: bool
    accepted: str | None


def installed_set(facts: PackageFacts, release_id: str, software: SoftwareVersions) -> list[tuple[str, str]]:
    """(package, version) for the driver, the CUDA toolkit, NCCL and DCGM as the roles pin them."""
    release = facts.release(release_id)
    wanted = [
        (n, software.driver_version)
        for n in release.driver_packages.names(software.driver_branch, software.open_kernel_modules)
    ]
    wanted.append((f"cuda-toolkit-{software.cuda.replace('.', '-')}", software.cuda_package_version))
    nccl = f"{software.nccl}-1+cuda{software.nccl_cuda_build}"
    nccl_names = ("libnccl", "libnccl-devel") if release.family == "rhel" else ("libnccl2", "libnccl-dev")
    wanted += [(name, nccl) for name in nccl_names]
    if software.dcgm_version:
        wanted += [
            ("datacenter-gpu-manager-4-core", software.dcgm_version),
            (f"datacenter-gpu-manager-4-cuda{software.driver_cuda_major}", software.dcgm_version),
        ]
    return wanted


def resting_facts(facts: PackageFacts, release_id: str, software: SoftwareVersions) -> list[RestingFact]:
    result = []
    for name, version in installed_set(facts, release_id, software):
        entries = [
            p
            for p in facts.packages_of(release_id, ("cuda",))
            if p.name == name and any(v == version or upstream_version(v) == version for v in p.versions)
        ]
        entry = entries[0] if entries else None
        result.append(
            RestingFact(
                package=name,
                version=version,
                listed=entry is not None,
                verified=entry is not None and entry.verified,
                accepted=entry.accepted if entry is not None else None,
            )
        )
    return result


def unaccepted(facts: list[RestingFact]) -> list[RestingFact]:
    """Facts a stack rests on that are neither seen in the index nor accepted with a reason."""
    return [f for f in facts if not f.verified and not f.accepted]
