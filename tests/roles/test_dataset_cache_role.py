"""roles/slurm_compute's dataset cache (tasks/dataset_cache.yml): a system user owns the cache, every
user stages through a sudoers drop-in that allows exactly /usr/local/bin/gpuplat-dataset as that user,
and /etc/gpuplat/datasets.json is what the program accepts. Rendered with Ansible's own templating from
the role's defaults and vars; the drop-in is checked by the real visudo where it is installed
(scripts/setup-host.sh installs sudo on CI). The play itself is not run here (it would add a user and a
sudoers file to this host): the Slurm scenario's nodes run it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ansible")

from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "slurm_compute"
PROGRAM = ROLE / "files" / "gpuplat_dataset_cache.py"
CACHE = "/var/cache/gpuplat/datasets"
DATASETS = [{"name": "demo-corpus", "version": "v1", "source": "/shared/datasets/demo-corpus/v1"}]


def _templar(**overrides: Any) -> Templar:
    loader = DataLoader()
    variables: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        variables.update(loader.load_from_file(str(ROLE / part / "main.yml"), trusted_as_template=True) or {})
    variables.update(
        ansible_managed="Ansible managed",
        slurm_compute_dataset_cache_path=CACHE,
        slurm_compute_datasets=DATASETS,
        gpuplat_gpu_count=0,
        **overrides,
    )
    return Templar(loader=loader, variables=variables)


def _sudoers(**overrides: Any) -> str:
    text = (ROLE / "templates" / "gpuplat-dataset.sudoers.j2").read_text()
    return str(_templar(**overrides).template(trust_as_template(text)))


def _tasks() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load((ROLE / "tasks" / "dataset_cache.yml").read_text())
    return {task["name"]: task for task in document}


def test_the_sudoers_drop_in_allows_only_the_program_as_the_cache_user() -> None:
    rules = [line for line in _sudoers().splitlines() if line and not line.startswith("#")]
    assert rules[-1] == "ALL ALL=(gpuplat-cache) NOPASSWD: /usr/local/bin/gpuplat-dataset"
    assert all("*" not in line and "ALL=(ALL" not in line for line in rules)
    other = _sudoers(slurm_compute_dataset_cache_user="datacache")
    assert "ALL ALL=(datacache) NOPASSWD: /usr/local/bin/gpuplat-dataset" in other


VISUDO = shutil.which("visudo") or shutil.which("visudo", path="/usr/sbin:/sbin")


@pytest.mark.skipif(VISUDO is None, reason="visudo is not installed (scripts/setup-host.sh installs sudo)")
def test_the_sudoers_drop_in_passes_visudo(tmp_path: Path) -> None:
    visudo = VISUDO
    assert visudo
    dropin = tmp_path / "gpuplat-dataset"
    dropin.write_text(_sudoers())
    checked = subprocess.run([visudo, "-cf", str(dropin)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "broken"
    broken.write_text(_sudoers().replace("NOPASSWD:", "NOPASSWD"))  # the check can fail
    assert subprocess.run([visudo, "-cf", str(broken)], capture_output=True, check=False).returncode != 0


def test_the_role_validates_the_drop_in_and_makes_the_cache_the_users() -> None:
    tasks = _tasks()
    sudoers = tasks["Let every user run gpuplat-dataset as the cache's user (that program only)"]
    template = sudoers["ansible.builtin.template"]
    assert template["validate"] == "/usr/sbin/visudo -cf %s" and template["mode"] == "0440"
    assert any(t.get("ansible.builtin.apt", {}).get("name") == "sudo" for t in tasks.values())
    user = tasks["Create the cache's user (no login, no home)"]["ansible.builtin.user"]
    assert user["system"] is True and user["shell"] == "/usr/sbin/nologin"
    directory = tasks["Create the cache directory (the cache's user's; every user reads it)"][
        "ansible.builtin.file"
    ]
    assert directory["owner"] == "{{ slurm_compute_dataset_cache_user }}" and directory["mode"] == "0755"
    # A cache from before (root's, sticky 1777, entries of whoever staged first) is emptied, not trusted;
    # nothing else is: the condition names that layout.
    emptied = tasks[
        "Empty a cache made before the cache's user (its copies may have been changed by any user)"
    ]
    assert "__slurm_compute_cache_stat.stat.mode == '1777'" in emptied["when"]
    program = tasks["Install gpuplat-dataset, which stages the stack's datasets into the cache"]
    dest = _templar().template(trust_as_template(program["ansible.builtin.copy"]["dest"]))
    assert dest == "/usr/local/bin/gpuplat-dataset"


@pytest.mark.parametrize("cap", [0, 500 * 10**9])
def test_the_configuration_the_role_writes_is_what_the_program_reads(tmp_path: Path, cap: int) -> None:
    rendered = _templar(slurm_compute_dataset_cache_max_bytes=cap).template(
        trust_as_template("{{ __slurm_compute_dataset_config | to_nice_json }}")
    )
    document = json.loads(str(rendered))
    assert document == {"cache_path": CACHE, "cache_user": "gpuplat-cache", "cache_max_bytes": cap,
                        "datasets": DATASETS}  # fmt: skip
    config = tmp_path / "datasets.json"
    config.write_text(str(rendered))
    listed = subprocess.run(
        [sys.executable, str(PROGRAM), "--config", str(config), "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0 and listed.stdout.startswith("demo-corpus\tv1\t-\t"), listed.stderr


def test_the_new_variables_are_declared() -> None:
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for name in ("slurm_compute_dataset_cache_user", "slurm_compute_dataset_cache_max_bytes"):
        assert specs[name]["default"] == defaults[name]
