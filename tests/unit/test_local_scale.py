"""`gpuplat scale` on the local backend: which pools, how many nodes, and what the cluster then runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.backends.local.cluster import LocalCluster
from infra.backends.local.scale import check_request, running_sizes, with_running_sizes
from infra.errors import ExitCode, GpuPlatError
from infra.platform.resolve import ResolvedPlatform


@pytest.fixture
def local(
    shipped_platforms: dict[str, ResolvedPlatform], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> ResolvedPlatform:
    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path))
    return shipped_platforms["local"]


@pytest.mark.parametrize(
    ("pool", "nodes", "expected"),
    [
        ("infer", 1, "scales only its elastic pools (min < max): train"),
        ("nope", 1, "--pool 'nope'"),
        ("train", 4, "--nodes 4: pool train runs between 2 and 3 nodes"),
        ("train", 1, "between 2 and 3"),
    ],
)
def test_bad_requests_are_bad_input(local: ResolvedPlatform, pool: str, nodes: int, expected: str) -> None:
    with pytest.raises(GpuPlatError) as raised:
        check_request(local, pool, nodes)
    assert expected in raised.value.message and raised.value.exit_code == ExitCode.BAD_INPUT


def test_an_elastic_pool_runs_its_minimum_until_scaled(local: ResolvedPlatform) -> None:
    assert running_sizes(local) == {"train": 2}
    cluster = LocalCluster(with_running_sizes(local))
    assert [n.name for n in cluster.nodes if n.pool == "train"] == ["train-0", "train-1"]
    # Every possible node keeps its address, so nodes that exist resolve the ones added later.
    addresses = {n.name: n.address for n in cluster.possible_nodes}
    grown = LocalCluster(with_running_sizes(local, {"train": 3}))
    assert {n.name: n.address for n in grown.nodes} | addresses == addresses
    assert "train-2" in {n.name for n in grown.nodes}
