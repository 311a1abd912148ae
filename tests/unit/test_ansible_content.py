"""What a converge depends on: the content of playbooks/ and roles/, not the caches running it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.lifecycle import bringup
from infra.nodes.ansible_content import content_files


def project(tmp_path: Path) -> Path:
    (tmp_path / "playbooks" / "connection_plugins").mkdir(parents=True)
    (tmp_path / "playbooks" / "site.yml").write_text("- hosts: all\n")
    (tmp_path / "playbooks" / "connection_plugins" / "gpuplat_podman.py").write_text("x = 1\n")
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "tasks" / "main.yml").write_text("[]\n")
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    return tmp_path


def test_caches_left_by_a_run_are_not_content(tmp_path: Path) -> None:
    root = project(tmp_path)
    before = content_files(root)
    cache = root / "playbooks" / "connection_plugins" / "__pycache__"
    cache.mkdir()
    (cache / "gpuplat_podman.cpython-311.pyc").write_bytes(b"\x00")
    # mypy's and ruff's caches, an editor's swap file: before, each was bundle content, a new bundle
    # digest, and every training node in service was drained for it
    for left in (
        "roles/r/.mypy_cache/3.11/x.json",
        "playbooks/.ruff_cache/CACHEDIR.TAG",
        "roles/r/tasks/.main.yml.swp",
    ):
        (root / left).parent.mkdir(parents=True, exist_ok=True)
        (root / left).write_text("x")
    assert content_files(root) == before
    # ansible.cfg rides along: the bundle's playbooks find the roles and plugins through it.
    assert [p.name for p in before] == ["ansible.cfg", "gpuplat_podman.py", "site.yml", "main.yml"]


def test_a_converge_stays_skipped_after_ansible_loaded_the_connection_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bringup, "PROJECT_ROOT", project(tmp_path))
    first = bringup.configuration_fingerprint("inventory", ["m1"])
    cache = tmp_path / "playbooks" / "connection_plugins" / "__pycache__"
    cache.mkdir()
    (cache / "gpuplat_podman.cpython-311.pyc").write_bytes(b"\x00")
    assert bringup.configuration_fingerprint("inventory", ["m1"]) == first
    (tmp_path / "roles" / "r" / "tasks" / "main.yml").write_text("- debug: {}\n")
    assert bringup.configuration_fingerprint("inventory", ["m1"]) != first
