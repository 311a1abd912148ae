"""The EFA installer for the NCCL the nodes load: its aws-ofi-nccl plugin must support every one of them.

Jobs load the NCCL of the training environment's torch wheel (nvidia-nccl-cuNN), not the node's libnccl2
that nccl-tests link: both go through the same plugin, so both count. An aws-ofi-nccl release names the
newest NCCL it supports ("supports NCCL vX while maintaining backward compatibility with NCCL v2.17.1
and later": infra/data/packages.yaml, efa_installer); other patch releases of that NCCL minor are taken
as supported, a newer minor is not. The newest installer whose plugin supports them all is chosen; a
pinned one that does not is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.data.models import version_tuple
from infra.data.packages import EfaInstaller, EfaInstallerRelease, Release

Problem = tuple[str, str]
OLDEST_NCCL = (2, 17, 1)  # "backward compatibility with NCCL v2.17.1 and later" (every release from 1.15.0)


@dataclass(frozen=True)
class NcclUse:
    """An NCCL the nodes load, and who loads it (said in the plan and in refusals)."""

    version: str
    loaded_by: str


@dataclass(frozen=True)
class EfaStack:
    installer: str
    aws_ofi_nccl: str
    nccl_supported: str
    plugin_path: str
    sha256: str | None  # None: none recorded (the role still checks AWS's signature)


def supports(release: EfaInstallerRelease, nccl: str) -> bool:
    wanted = version_tuple(nccl)
    return wanted >= OLDEST_NCCL and wanted[:2] <= version_tuple(release.nccl_supported)[:2]


def _stack(release: EfaInstallerRelease, os_release: Release) -> EfaStack:
    return EfaStack(
        installer=release.version,
        aws_ofi_nccl=release.aws_ofi_nccl,
        nccl_supported=release.nccl_supported,
        plugin_path=release.plugin_path(os_release),
        sha256=release.sha256,
    )


def resolve_efa(
    facts: EfaInstaller, uses: list[NcclUse], pinned: str | None, os_release: Release, path: str
) -> tuple[EfaStack | None, list[Problem]]:
    """The installer for `uses`; `pinned` (software.efa_installer) must be a known release that fits."""

    def unsupported(release: EfaInstallerRelease) -> list[NcclUse]:
        return [u for u in uses if not supports(release, u.version)]

    fitting = [r for r in facts.releases if not unsupported(r)]
    needs = ", ".join(f"{u.version} ({u.loaded_by})" for u in uses)
    fits_text = ", ".join(r.version for r in fitting) or "none in infra/data/packages.yaml"
    if pinned is not None:
        release = facts.release(pinned)
        if release is None:
            return None, [(path, f"unknown EFA installer {pinned}; known: {', '.join(facts.versions)}")]
        missing = unsupported(release)
        if missing:
            return None, [
                (
                    path,
                    f"EFA installer {pinned} installs aws-ofi-nccl {release.aws_ofi_nccl}, which supports "
                    f"NCCL up to {release.nccl_supported}; the nodes load NCCL "
                    + ", ".join(f"{u.version} ({u.loaded_by})" for u in missing)
                    + f". Installers whose plugin supports {needs}: {fits_text}; or omit it to get the "
                    "newest",
                )
            ]
        return _stack(release, os_release), []
    if not fitting:
        newest = max(facts.releases, key=lambda r: version_tuple(r.version))
        return None, [
            (
                path,
                f"no EFA installer in infra/data/packages.yaml has an aws-ofi-nccl plugin that supports "
                f"NCCL {needs} (the newest, {newest.version}, installs aws-ofi-nccl {newest.aws_ofi_nccl}: "
                f"NCCL up to {newest.nccl_supported}); pick an older training.torch_version or software.nccl",
            )
        ]
    return _stack(max(fitting, key=lambda r: version_tuple(r.version)), os_release), []
