"""What a local stack keeps on the host across `gpuplat down` (infra/backends/local/host_caches.py), and
`down --purge`, which removes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.backends.local.cluster import LocalCluster
from infra.cli.commands import lifecycle
from infra.errors import SpecError


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
