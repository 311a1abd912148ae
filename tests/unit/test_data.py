"""The shipped data files load, carry sources, and hold the figures the platform depends on."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.data.load import catalog, compatibility, load_data_file
from infra.data.models import Catalog
from infra.errors import SpecError

REQUIRED_TYPES = [
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge",
    "hgx-h100", "hgx-h200", "hgx-b200",
]  # fmt: skip


@pytest.mark.parametrize("name", REQUIRED_TYPES)
def test_catalog_has_required_node_types(name: str) -> None:
    node = catalog().get(name)
    assert node is not None and node.gpu is not None and node.gpu.count == 8
    assert node.source.startswith("http") or "from memory" in node.source


@pytest.mark.parametrize("family", ["g5", "g6", "g6e"])
def test_catalog_has_g_families(family: str) -> None:
    assert len([n for n in catalog().node_types if n.family == family]) >= 3


@pytest.mark.parametrize(("name", "nics"), [("p5.48xlarge", 32), ("p4d.24xlarge", 4), ("p5en.48xlarge", 16)])
def test_efa_interface_counts(name: str, nics: int) -> None:
    node = catalog().get(name)
    assert node is not None and node.network.fabric == "efa" and node.network.nics == nics


def test_every_gpu_node_with_nvswitch_is_8_gpu() -> None:
    for node in catalog().node_types:
        if node.gpu and node.gpu.nvswitch:
            assert node.gpu.count == 8, node.name


def test_spot_price_is_below_on_demand() -> None:
    node = catalog().get("p5.48xlarge")
    assert node is not None and node.spot_usd_per_hour is not None
    assert node.spot_usd_per_hour < node.price.on_demand_usd_per_hour


def test_compatibility_rules_present() -> None:
    data = compatibility()
    blackwell = next(a for a in data.architectures if a.architecture == "blackwell")
    assert blackwell.open_kernel_modules == "required"
    assert {d.branch for d in data.drivers} >= {535, 550, 570, 580}
    assert all(d.version.startswith(f"{d.branch}.") for d in data.drivers)


def test_bad_data_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("node_types:\n  - name: x\n    provider: mars\n")
    with pytest.raises(SpecError) as raised:
        load_data_file(path, Catalog)
    assert str(path) in raised.value.message and "node_types[0].provider" in raised.value.message


def test_every_supported_release_says_which_mpi_plugins_its_slurm_ships() -> None:
    from infra.data.packages import SUPPORTED_RELEASES, package_facts

    for release_id in SUPPORTED_RELEASES:
        slurm = package_facts().release(release_id).slurm
        assert slurm is not None and slurm.mpi_default in ("pmix", "pmi2"), release_id
    jammy = package_facts().release("ubuntu2204").slurm
    assert jammy is not None and "pmix" not in jammy.mpi_plugins and jammy.mpi_default == "pmi2"


def test_mpi_plugins_and_the_pmix_package_must_agree() -> None:
    from pydantic import ValidationError

    from infra.data.packages import SlurmFacts

    with pytest.raises(ValidationError, match="pmix exactly when"):
        SlurmFacts(
            version="21.08.5", pmix_plugin_package=None, nvml_plugin_package=None, mpi_plugins=["pmix"]
        )


def test_node_ansible_facts_cover_every_node_release_with_sources() -> None:
    from typing import get_args

    from infra.data.node_ansible import node_ansible_facts
    from infra.spec.models import OsRelease

    facts = node_ansible_facts()
    assert {p.release for p in facts.os_pythons} == set(get_args(OsRelease))
    entries = [*facts.os_pythons, *facts.ansible_core, *facts.ansible_releases, *facts.role_features]
    assert all("http" in e.source or "migrated from Ansible 2.9" in e.source for e in entries)
