"""The gpu_driver role's apt pin, against real apt: a dependency of the installed driver packages must not
float to a newer driver the repository also carries.

apt carries an `=version` choice only to the packages named on the command line; a dependency declared
with `>=` (the form NVIDIA's Debian meta packages use: cuda-drivers-580 "Depends: nvidia-driver (>=
580.65.06)", which pulled 590 components, forums.developer.nvidia.com/t/353805) takes the newest version
the repository offers unless a pin holds it. The repository here is built for the test: the role's
Debian install set, each at two driver versions, the CUDA user space depending on one more package of
the driver's family with `>=`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from infra.data.packages import package_facts
from tests.roles.ansible_values import render_value

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_driver"

PINNED, NEWER = "570.195.03", "580.95.05"
DEPENDENCY = "libnvidia-ml1"  # a package of the driver's family the named packages pull in

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("apt-get", "dpkg-deb", "apt-ftparchive")),
    reason="needs apt-get, dpkg-deb and apt-ftparchive (Debian's apt and apt-utils: scripts/setup-host.sh)",
)


def role_variables() -> dict[str, Any]:
    release = {"driver_packages": package_facts().release("debian12").driver_packages.model_dump()}
    variables: dict[str, Any] = {
        "gpu_driver_branch": 570,
        "gpu_driver_version": PINNED,
        "gpu_driver_open_kernel_modules": True,
        "gpu_driver_extra_packages": [],
        "nvidia_common_release": release,
    }
    env = jinja2.Environment()
    for key, value in yaml.safe_load((ROLE / "vars" / "main.yml").read_text()).items():
        if key.startswith(("__gpu_driver_install_set", "__gpu_driver_packages", "__gpu_driver_family")):
            variables[key] = render_value(env, value, variables)
    return variables


def build_package(name: str, version: str, depends: list[str], pool: Path, work: Path) -> None:
    root = work / f"{name}_{version}"
    (root / "DEBIAN").mkdir(parents=True)
    control = [f"Package: {name}", f"Version: {version}", "Architecture: all", "Maintainer: t <t@t.invalid>"]
    if depends:
        control.append("Depends: " + ", ".join(depends))
    control.append(f"Description: stand-in for {name}")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(pool / f"{name}_{version}_all.deb")],
        check=True,
        capture_output=True,
    )


def simulate_install(tmp_path: Path, packages: list[str], preferences: str | None) -> dict[str, str]:
    """Package -> the version `apt-get install -s` would install, in an apt root of its own."""
    repo, work, state = tmp_path / "repo", tmp_path / "work", tmp_path / "state"
    if not repo.exists():
        repo.mkdir()
        for upstream in (PINNED, NEWER):
            version = f"{upstream}-1"
            for name in packages:
                depends = [f"{DEPENDENCY} (>= {PINNED})"] if name == "nvidia-driver-cuda" else []
                build_package(name, version, depends, repo, work)
            build_package(DEPENDENCY, version, [], repo, work)
        with open(repo / "Packages", "wb") as index:
            subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, stdout=index, check=True)
    shutil.rmtree(state, ignore_errors=True)
    (state / "lists" / "partial").mkdir(parents=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True)
    (state / "preferences.d").mkdir()
    (state / "status").write_text("")
    (state / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    if preferences is not None:
        (state / "preferences.d" / "gpuplat-gpu-driver.pref").write_text(preferences)
    options = [
        f"-oDir::State::Lists={state / 'lists'}",
        f"-oDir::State::status={state / 'status'}",
        f"-oDir::Cache={state / 'cache'}",
        f"-oDir::Etc::SourceList={state / 'sources.list'}",
        "-oDir::Etc::SourceParts=/nonexistent",
        f"-oDir::Etc::PreferencesParts={state / 'preferences.d'}",
        "-oDir::Etc::Preferences=/nonexistent",
        "-oDebug::NoLocking=1",
        "-oAPT::Architecture=amd64",
    ]
    subprocess.run(["apt-get", *options, "update"], check=True, capture_output=True)
    wanted = [f"{name}={PINNED}-*" for name in packages]
    result = subprocess.run(
        ["apt-get", *options, "-s", "install", *wanted], check=True, capture_output=True, text=True
    )
    return {
        words[1]: words[2].strip("(")
        for words in (line.split() for line in result.stdout.splitlines())
        if words[:1] == ["Inst"]
    }


def rendered_pin(variables: dict[str, Any]) -> str:
    env = jinja2.Environment()
    env.filters["comment"] = lambda text: f"# {text}"
    template = env.from_string((ROLE / "templates" / "apt-preferences.j2").read_text())
    return template.render(ansible_managed="Ansible managed", **variables)


def test_without_a_pin_the_dependency_floats_to_the_newer_driver(tmp_path: Path) -> None:
    """The repository reproduces the defect: the named packages come at the pinned version, their
    dependency at the newest."""
    installed = simulate_install(tmp_path, role_variables()["__gpu_driver_packages"], preferences=None)
    assert installed[DEPENDENCY] == f"{NEWER}-1"
    assert installed["nvidia-driver-cuda"] == f"{PINNED}-1"


def test_the_roles_pin_holds_every_package_of_the_driver_dependencies_included(tmp_path: Path) -> None:
    variables = role_variables()
    installed = simulate_install(tmp_path, variables["__gpu_driver_packages"], rendered_pin(variables))
    assert set(installed) == {*variables["__gpu_driver_packages"], DEPENDENCY}
    wrong = {name: version for name, version in installed.items() if version != f"{PINNED}-1"}
    assert not wrong, f"not at the pinned driver {PINNED}: {wrong}"
