"""The gpu_driver role holds the kernel the driver's DKMS module was built for, and keeps unattended-upgrades
off it (roles/gpu_driver: __gpu_driver_kernel_hold, templates/unattended-upgrades.j2), rendered with
Ansible's own templating. The plan's side (a release whose archive carries a kernel outside the driver's
known range is warned about) is tested against the project's data.

Not modelled: apt itself holding the packages (tests/roles/test_driver_pin.py covers the driver pin with
real apt; a held package is dpkg's, not the role's)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ansible")

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from infra.data.load import compatibility
from infra.data.packages import package_facts
from infra.platform.kernels import kernels_outside_range

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_driver"


def templar(kernel: str) -> Templar:
    loader = DataLoader()
    variables: dict[str, Any] = loader.load_from_file(
        str(ROLE / "vars" / "main.yml"), trusted_as_template=True
    )
    variables["ansible_facts"] = {"kernel": kernel}
    return Templar(loader=loader, variables=variables)


def resolve(templar_: Templar, name: str) -> Any:
    return templar_.template(trust_as_template(f"{{{{ {name} }}}}"))


@pytest.mark.parametrize(
    ("kernel", "metas"),
    [
        ("6.8.0-1008-aws", ["linux-aws", "linux-image-aws", "linux-headers-aws", "linux-modules-extra-aws"]),
        (
            "6.1.0-28-cloud-amd64",
            [
                "linux-image-cloud-amd64",
                "linux-headers-cloud-amd64",
                "linux-image-cloud-arm64",
                "linux-headers-cloud-arm64",
                "linux-image-amd64",
                "linux-headers-amd64",
            ],
        ),
        # Nodes on a distribution's generic kernel (onprem): the metas that would move it on are held too.
        (
            "6.8.0-51-generic",
            [
                "linux-generic",
                "linux-image-generic",
                "linux-headers-generic",
                "linux-generic-hwe-22.04",
                "linux-image-generic-hwe-22.04",
                "linux-headers-generic-hwe-22.04",
                "linux-generic-hwe-24.04",
                "linux-image-generic-hwe-24.04",
                "linux-headers-generic-hwe-24.04",
            ],
        ),
        ("6.1.0-28-amd64", ["linux-image-amd64", "linux-headers-amd64"]),
    ],
)
def test_the_running_kernel_and_its_meta_packages_are_held(kernel: str, metas: list[str]) -> None:
    held = resolve(templar(kernel), "__gpu_driver_kernel_hold")
    assert held == [f"linux-image-{kernel}", f"linux-modules-{kernel}", f"linux-headers-{kernel}", *metas]


def test_unattended_upgrades_leave_the_kernel_and_the_driver_alone() -> None:
    """unattended-upgrades reads Package-Blacklist entries as Python regular expressions matched at the start
    of a package name: every kernel package a security upgrade brings, and the driver's family, match."""
    patterns = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__gpu_driver_unattended_blacklist"]
    blocked = [
        "linux-image-7.0.0-1018-aws",
        "linux-headers-7.0.0-1018-aws",
        "linux-modules-7.0.0-1018-aws",
        "linux-aws",
        "linux-image-cloud-amd64",
        "linux-headers-cloud-amd64",
        "nvidia-kernel-open-dkms",
        "libnvidia-compute-580",
        "libcuda1",
    ]
    for package in blocked:
        assert any(re.match(p, package) for p in patterns), package
    for package in ("openssl", "libc6", "linux-base", "slurmd"):
        assert not any(re.match(p, package) for p in patterns), package
    rendered = (ROLE / "templates" / "unattended-upgrades.j2").read_text()
    assert "Unattended-Upgrade::Package-Blacklist {" in rendered


def test_noble_updates_kernel_7_0_is_outside_the_pinned_580_drivers_range() -> None:
    """Ubuntu 24.04's linux-headers-aws reached 7.0.0-1018 in noble-updates; 580.126.18 fails to build on 7.0
    (void-linux/void-packages#60171), so 580.95.05 is not known to build there."""
    [outside] = kernels_outside_range(compatibility(), package_facts(), "ubuntu2404", 580, "580.95.05")
    assert (outside.package, outside.series, outside.kernel_below) == ("linux-headers-aws", "7.0", "7.0")
    assert kernels_outside_range(compatibility(), package_facts(), "ubuntu2204", 580, "580.95.05") == []
    # A driver with the 7.1 build fix is known to build on 7.0.
    assert kernels_outside_range(compatibility(), package_facts(), "ubuntu2404", 580, "580.159.04") == []
