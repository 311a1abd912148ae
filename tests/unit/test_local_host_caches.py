"""What a local stack keeps on the host across `gpuplat down` (infra/backends/local/host_caches.py), and
`down --purge`, which removes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.backends.local import cluster
from infra.backends.local.cluster import LocalCluster
from infra.backends.local.scale import with_running_sizes
from infra.cli.commands import lifecycle
from infra.errors import SpecError
from infra.nodes.inventory import inventory_documents
from infra.platform.resolve import ResolvedPlatform
from infra.training.job_env import LOCAL_ENVIRONMENT_ARCHIVES


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The local stack's wheels and environment archives on disk; `down` finds no machine to remove."""
    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(LocalCluster, "destroy", lambda self: [])
    directories = [tmp_path / "local" / "wheels", tmp_path / "local" / "environments"]
    for directory in directories:
        directory.mkdir(parents=True)
        (directory / "kept").write_text("x")
    return directories


def test_down_keeps_the_wheels_and_archives_and_purge_removes_them(kept: list[Path]) -> None:
    lifecycle.down(stack="local")
    assert all((d / "kept").is_file() for d in kept)
    lifecycle.down(stack="local", purge=True)
    assert not any(d.exists() for d in kept)


def test_purge_on_a_cloud_stack_is_refused_naming_why(kept: list[Path]) -> None:
    with pytest.raises(SpecError, match="--purge removes what a local stack keeps") as refusal:
        lifecycle.down(stack="aws-prod", purge=True)
    assert refusal.value.exit_code == 2
    assert all((d / "kept").is_file() for d in kept)


def test_each_node_mounts_its_own_archives_writable_where_the_inventory_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path))
    runs: list[tuple[str, ...]] = []

    def podman(*args: str, **_: object) -> subprocess.CompletedProcess[str]:
        if args[0] == "run":
            runs.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(cluster, "podman", podman)
    monkeypatch.setattr(cluster, "exists", lambda kind, name: kind == "image")
    monkeypatch.setattr(cluster, "inspect", lambda kind, name: None)
    monkeypatch.setattr(cluster, "ensure_wheelhouse", lambda platform: tmp_path / "local" / "wheels")
    for quiet in ("wait_systemd", "simulate_gpus", "share_host_ca"):
        monkeypatch.setattr(cluster, quiet, lambda *args: False)
    local = with_running_sizes(shipped_platforms["local"])
    LocalCluster(local).ensure({})
    # Each node its own folder (no :ro there): root on one node cannot replace what another unpacks.
    assert len(runs) == 4
    for run in runs:
        node = run[run.index("--hostname") + 1]
        assert f"{tmp_path / 'local' / 'environments' / node}:{LOCAL_ENVIRONMENT_ARCHIVES}" in run
        assert sum(LOCAL_ENVIRONMENT_ARCHIVES in arg for arg in run) == 1
    values = inventory_documents(local)["hosts.yml"]["all"]["vars"]
    assert values["python_requirements_archive_dir"] == LOCAL_ENVIRONMENT_ARCHIVES
