"""The package facts (infra/data/packages.yaml) drive the roles and the fixture; both stay inside them.

- the roles' generated per-release facts are up to date with the table;
- the fixture repository offers nothing the table lacks (planned and built indexes are checked);
- the driver package set each role installs is real for every supported release: one kernel module
  flavour, no meta package that drags in the other one, every name published at the pinned version;
- the versions the shipped stacks resolve to are published for their OS release.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest
import yaml

from infra.data.packages import SUPPORTED_RELEASES, Release, package_facts, role_release_facts
from infra.platform.resolve import ResolvedPlatform
from tests.roles.ansible_values import render_value

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_role_release_facts_are_generated_from_the_table() -> None:
    committed = yaml.safe_load((ROLES / "nvidia_common" / "vars" / "releases.yml").read_text())
    assert committed["__nvidia_common_releases"] == role_release_facts(package_facts()), (
        "roles/nvidia_common/vars/releases.yml is stale: run scripts/generate-role-facts.py"
    )
    assert set(committed["__nvidia_common_releases"]) == set(SUPPORTED_RELEASES)


def test_generator_check_mode_agrees() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate-role-facts.py"), "--check"], capture_output=True
    )
    assert result.returncode == 0, result.stderr.decode()


def test_fixture_plans_only_what_the_table_lists() -> None:
    fixture = load_script("build-fixture-repo")
    facts = package_facts()
    for release_id in fixture.FIXTURE_RELEASES:
        for repository in ("cuda", "container-toolkit"):
            offered = facts.offered(release_id, repository)
            planned = {(deb.name, deb.version) for deb in fixture.planned_debs(facts, release_id, repository)}
            assert planned, f"{release_id}/{repository}: the fixture would be empty"
            assert fixture.unlisted(planned, offered) == []


def test_fixture_index_check_catches_an_invented_package() -> None:
    fixture = load_script("build-fixture-repo")
    index = fixture.parse_index(
        "Package: libnccl2\nVersion: 2.27.3-1+cuda12.9\nArchitecture: amd64\n\n"
        "Package: libnccl2\nVersion: 2.27.3-1+cuda12.8\nArchitecture: amd64\n\n"
        "Package: nvidia-made-up\nVersion: 1.0-1\n"
    )
    offered = package_facts().offered("debian12", "cuda")
    assert fixture.unlisted(index, offered) == ["libnccl2 2.27.3-1+cuda12.8", "nvidia-made-up 1.0-1"]


def test_fixture_depends_are_satisfiable_inside_the_fixture() -> None:
    """apt must be able to install every stand-in from the fixture alone (the test nodes have no network)."""
    fixture = load_script("build-fixture-repo")
    facts = package_facts()
    for release_id in fixture.FIXTURE_RELEASES:
        for repository in ("cuda", "container-toolkit"):
            debs = fixture.planned_debs(facts, release_id, repository)
            versions: dict[str, set[str]] = {}
            for deb in debs:
                versions.setdefault(deb.name, set()).add(deb.version)
            for deb in debs:
                for dependency in deb.depends:
                    name, _, relation = dependency.partition(" ")
                    assert name in versions, (
                        f"{deb.name} {deb.version} depends on {dependency}: not in the fixture"
                    )
                    if relation.startswith("(= "):
                        wanted = relation[3:-1]
                        assert wanted in versions[name], (
                            f"{deb.name} {deb.version}: {dependency} is unsatisfiable"
                        )


# --- the driver package sets of roles/gpu_driver against the table --------------------------------


def driver_packages(release_id: str, branch: int, open_modules: bool) -> tuple[list[str], str]:
    """(packages installed, the other flavour removed) as roles/gpu_driver/vars renders them."""
    release = role_release_facts(package_facts())[release_id]
    env = jinja2.Environment()
    variables: dict[str, Any] = {
        "gpu_driver_branch": branch,
        "gpu_driver_open_kernel_modules": open_modules,
        "gpu_driver_extra_packages": [],
        "nvidia_common_release": release,
    }
    role_vars = yaml.safe_load((ROLES / "gpu_driver" / "vars" / "main.yml").read_text())
    for key in ("__gpu_driver_install_set", "__gpu_driver_other_kernel_package", "__gpu_driver_packages"):
        variables[key] = render_value(env, role_vars[key], variables)
    return variables["__gpu_driver_packages"], variables["__gpu_driver_other_kernel_package"]


def published(release_id: str, name: str, upstream: str) -> bool:
    versions = role_release_facts(package_facts())[release_id]["published"].get(name, [])
    return any(v.split(":", 1)[-1].rsplit("-", 1)[0] == upstream for v in versions)


@pytest.mark.parametrize("release_id", ["debian12", "ubuntu2204", "ubuntu2404"])
def test_open_driver_set_is_one_flavour_and_published(
    release_id: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    software = shipped_platforms["aws-prod"].software
    packages, other = driver_packages(release_id, software.driver_branch, software.open_kernel_modules)
    assert other not in packages
    assert not [
        p for p in packages if p.startswith(("cuda-drivers", "nvidia-open", "nvidia-driver-pinning"))
    ], "meta packages pull the other kernel module flavour (cuda-drivers-N depends on the proprietary one)"
    missing = [p for p in packages if not published(release_id, p, software.driver_version)]
    assert not missing, f"{release_id}: not published at {software.driver_version}: {missing}"


def test_a_release_without_its_repository_key_is_refused() -> None:
    """debian13's key was null: the role then fetched `<repo>/None` and failed on the wrong reason."""
    table = yaml.safe_load((ROOT / "infra" / "data" / "packages.yaml").read_text())
    release = next(r for r in table["releases"] if r["id"] == "debian13")
    assert release["cuda_repo_key"] == "8793F200.pub"
    with pytest.raises(ValueError, match="cuda_repo_key"):
        Release.model_validate({**release, "cuda_repo_key": None})


def test_debian13_has_none_of_the_pinned_drivers(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    """NVIDIA's debian13 tree starts at branch 590 (packages.yaml): the roles must refuse, not guess."""
    software = shipped_platforms["aws-prod"].software
    packages, _ = driver_packages("debian13", software.driver_branch, software.open_kernel_modules)
    assert not any(published("debian13", p, software.driver_version) for p in packages)


@pytest.mark.parametrize("stack", ["local", "aws-prod", "onprem"])
def test_resolved_software_is_published_for_the_stacks_release(
    stack: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    software = shipped_platforms[stack].software
    release_id = str(software.os_release)
    release = role_release_facts(package_facts())[release_id]["published"]
    nccl = f"{software.nccl}-1+cuda{software.nccl_cuda_build}"
    cuda_toolkit = "cuda-toolkit-" + software.cuda.replace(".", "-")
    problems = [
        f"{name} {version}"
        for name, version, found in [
            ("libnccl2", nccl, nccl in release.get("libnccl2", [])),
            (
                cuda_toolkit,
                software.cuda_package_version,
                published(release_id, cuda_toolkit, software.cuda_package_version),
            ),
            (
                "driver",
                software.driver_version,
                published(
                    release_id,
                    driver_packages(release_id, software.driver_branch, True)[0][0],
                    software.driver_version,
                ),
            ),
        ]
        if not found
    ]
    assert not problems, (
        f"stack {stack} resolves to versions NVIDIA's {release_id} repository does not carry "
        f"(packages.yaml): {problems}"
    )
