"""Is the nodes' kernel inside the range the pinned driver is known to build its DKMS module on?

The OS release's archive moves its kernel on (Ubuntu 24.04's linux-aws went from 6.8 to 7.0 in
noble-updates); the driver is pinned. `infra/data/compatibility.yaml` (driver_kernels) records, per driver
branch, from which driver version which kernel series is the first not known to build; the kernels an OS
release carries are its kernel-header packages in `infra/data/packages.yaml`. A kernel outside the range
is a warning in the plan, not a refusal: the image boots the kernel it was built with and the gpu_driver
role holds it, so the newer one is only installed by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.data.models import Compatibility
from infra.data.packages import PackageFacts

_SERIES = re.compile(r"^(\d+)\.(\d+)")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


@dataclass(frozen=True)
class KernelOutsideRange:
    package: str
    version: str
    series: str
    kernel_below: str
    source: str

    def message(self, driver_version: str, release: str) -> str:
        return (
            f"{release}'s archive carries kernel {self.series} ({self.package} {self.version}); driver "
            f"{driver_version} is known to build its DKMS module only on kernels below {self.kernel_below} "
            f"({self.source.split(' ')[0]}). The gpu_driver role holds the kernel the node booted; do not "
            "upgrade it past that, or pin a driver that supports it"
        )


def kernels_outside_range(
    data: Compatibility, facts: PackageFacts, release_id: str, branch: int, driver_version: str
) -> list[KernelOutsideRange]:
    ranges = [
        r
        for r in data.driver_kernels
        if r.branch == branch and _version(r.driver_from) <= _version(driver_version)
    ]
    if not ranges:
        return []
    known = max(ranges, key=lambda r: _version(r.driver_from))
    found = []
    for package in facts.packages_of(release_id, ("distro",)):
        if package.component != "kernel" or not package.name.startswith(("linux-headers", "kernel-devel")):
            continue
        for version in package.versions:
            match = _SERIES.match(version)
            if match and (int(match[1]), int(match[2])) >= _version(known.kernel_below)[:2]:
                series = f"{match[1]}.{match[2]}"
                found.append(
                    KernelOutsideRange(package.name, version, series, known.kernel_below, known.source)
                )
    return found
