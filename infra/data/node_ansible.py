"""Facts for running Ansible on a node (infra/data/node_ansible.yaml): the OS release's Python, the
controller Pythons of each ansible-core series, the `ansible` releases a node may get, and what the roles
use that an Ansible must have. The choice itself is made in infra/data/node_ansible_choice.py."""

from __future__ import annotations

import datetime as dt
from functools import cache

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.data.load import DATA_DIR, load_data_file
from infra.data.models import version_tuple

NODE_ANSIBLE_FILE = DATA_DIR / "node_ansible.yaml"

_PYTHON = r"^3\.\d+$"
_RELEASE = r"^\d+\.\d+\.\d+$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sourced(_Strict):
    verified: bool = Field(description="read in the source itself (false: inferred, see source)")
    source: str = Field(min_length=8)
    as_of: dt.date


class OsPython(_Sourced):
    release: str = Field(description="an OS release id of packages.yaml (software.os_release)")
    python: str = Field(pattern=_PYTHON, description="major.minor of the release's python3")
    package: str
    venv_package: str = Field(description="the package that makes `python3 -m venv` work (ensurepip)")


class PythonRange(_Strict):
    min: str = Field(pattern=_PYTHON)
    max: str = Field(pattern=_PYTHON)

    def holds(self, python: str) -> bool:
        return version_tuple(self.min) <= version_tuple(python) <= version_tuple(self.max)


class CoreSeries(_Sourced):
    series: str = Field(pattern=r"^2\.\d+$")
    controller_python: PythonRange


class AnsibleRelease(_Sourced):
    version: str = Field(pattern=_RELEASE)
    ansible_core: str = Field(pattern=_RELEASE, description="the ansible-core it pins (~=)")
    requires_python: str = Field(pattern=_PYTHON, description="the package's Requires-Python lower bound")
    collections: dict[str, str] = Field(description="bundled collection -> version (those the roles use)")

    @property
    def core_series(self) -> str:
        return ".".join(self.ansible_core.split(".")[:2])


class RoleFeature(_Sourced):
    uses: str = Field(min_length=3, description="a module or plugin FQCN the roles name")
    ansible_core: str | None = Field(None, pattern=r"^2\.\d+(\.\d+)?$")
    collection: str | None = None
    version: str | None = Field(None, pattern=_RELEASE)

    @model_validator(mode="after")
    def _one_requirement(self) -> RoleFeature:
        if (self.ansible_core is None) == (self.collection is None):
            raise ValueError("give either ansible_core or collection (with version)")
        if (self.collection is None) != (self.version is None):
            raise ValueError("a collection requirement needs its version")
        return self


class NodeAnsibleFacts(_Strict):
    os_pythons: list[OsPython] = Field(min_length=1)
    ansible_core: list[CoreSeries] = Field(min_length=1)
    ansible_releases: list[AnsibleRelease] = Field(min_length=1)
    role_features: list[RoleFeature] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references_known(self) -> NodeAnsibleFacts:
        series = {s.series for s in self.ansible_core}
        for release in self.ansible_releases:
            if release.core_series not in series:
                raise ValueError(
                    f"ansible {release.version} pins ansible-core {release.ansible_core}: series "
                    f"{release.core_series} is not under ansible_core"
                )
        releases = [p.release for p in self.os_pythons]
        if len(releases) != len(set(releases)):
            raise ValueError("each OS release is listed once under os_pythons")
        return self

    def os_python(self, release: str) -> OsPython | None:
        return next((p for p in self.os_pythons if p.release == release), None)

    def core(self, series: str) -> CoreSeries:
        return next(s for s in self.ansible_core if s.series == series)


@cache
def node_ansible_facts() -> NodeAnsibleFacts:
    return load_data_file(NODE_ANSIBLE_FILE, NodeAnsibleFacts)
