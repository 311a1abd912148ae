"""What a GPU node needs from its first boot on (issue 50 item 8), rendered with Ansible's templating from the
roles' own vars: nvidia_uvm loaded at boot (roles/gpu_driver), UEFI Secure Boot read from its EFI variable
and refused without a signing key, and NVLink 5 systems' switch management packages (roles/fabric_manager).

Not modelled: a firmware with Secure Boot on (the EFI variable's bytes are given here)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ansible")

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"


def templar(role: str, extra_files: tuple[str, ...] = (), **variables: Any) -> Templar:
    loader = DataLoader()
    values: dict[str, Any] = {}
    for name in ("main.yml", *extra_files):
        values.update(loader.load_from_file(str(ROLES / role / "vars" / name), trusted_as_template=True))
    values.update(variables)
    return Templar(loader=loader, variables=values)


def resolve(templar_: Templar, name: str) -> Any:
    return templar_.template(trust_as_template(f"{{{{ {name} }}}}"))


@pytest.mark.parametrize(
    ("efi_variable", "secure_boot"),
    [(b"\x06\x00\x00\x00\x01", True), (b"\x06\x00\x00\x00\x00", False), (None, False)],
    ids=["on", "off", "no-uefi"],
)
def test_secure_boot_is_read_from_its_efi_variable(efi_variable: bytes | None, secure_boot: bool) -> None:
    slurped = {"content": base64.b64encode(efi_variable).decode()} if efi_variable else {"failed": True}
    assert (
        resolve(templar("gpu_driver", __gpu_driver_secure_boot=slurped), "__gpu_driver_secure_boot_on")
        is secure_boot
    )


def test_secure_boot_without_a_signing_key_stops_the_role() -> None:
    preflight = yaml.safe_load((ROLES / "gpu_driver" / "tasks" / "preflight.yml").read_text())
    [check] = [t for t in preflight if t["name"] == "Refuse Secure Boot without a signing key DKMS can use"]
    assert (
        check["ansible.builtin.assert"]["that"]
        == "not __gpu_driver_secure_boot_on or gpu_driver_secure_boot_signing"
    )
    defaults = yaml.safe_load((ROLES / "gpu_driver" / "defaults" / "main.yml").read_text())
    assert defaults["gpu_driver_secure_boot_signing"] is False


def test_nvidia_uvm_is_loaded_at_every_boot() -> None:
    modules = resolve(templar("gpu_driver"), "__gpu_driver_boot_modules")
    assert "nvidia_uvm" in modules
    configure = yaml.safe_load((ROLES / "gpu_driver" / "tasks" / "configure.yml").read_text())
    [boot] = [t for t in configure if t["name"] == "Load the driver's modules at boot, nvidia_uvm included"]
    assert boot["ansible.builtin.copy"]["dest"] == "{{ __gpu_driver_modules_load }}"
    assert resolve(templar("gpu_driver"), "__gpu_driver_modules_load").startswith("/etc/modules-load.d/")


@pytest.mark.parametrize("vars_file", ["Debian.yml", "Ubuntu.yml"])
def test_nvlink5_systems_get_libnvsdm_at_the_driver_version_and_infiniband_diags(vars_file: str) -> None:
    common = {"fabric_manager_version": "580.95.05"}
    blackwell = templar("fabric_manager", (vars_file,), gpuplat_gpu_architecture="blackwell", **common)
    assert resolve(blackwell, "__fabric_manager_packages")[-1] == "libnvsdm"
    assert resolve(blackwell, "__fabric_manager_nvlink5_packages") == ["nvlsm"]
    assert resolve(blackwell, "__fabric_manager_nvlink5_distro_packages") == ["infiniband-diags"]
    hopper = templar("fabric_manager", (vars_file,), gpuplat_gpu_architecture="hopper", **common)
    assert resolve(hopper, "__fabric_manager_packages") == ["nvidia-fabricmanager", "libnvidia-nscq"]
    assert resolve(hopper, "__fabric_manager_nvlink5_distro_packages") == []
