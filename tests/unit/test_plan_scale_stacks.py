"""The stacks benchmarks/plan_scale.py generates are valid platforms: a benchmark that cannot plan its
own input measures nothing (it failed so after the canary's borrow began to need two replicas)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.platform.resolve import load_platform
from tests.conftest import ROOT, load_script


@pytest.mark.parametrize(("pools", "nodes"), [(3, 10), (5, 100), (50, 1000)])
def test_every_generated_stack_resolves(
    pools: int, nodes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    plan_scale = load_script(ROOT / "benchmarks" / "plan_scale.py")
    path = tmp_path / f"Pulumi.bench-{pools}-{nodes}.yaml"
    path.write_text(yaml.safe_dump(plan_scale.scaled_stack(pools, nodes, f"bench-{pools}-{nodes}")))
    platform = load_platform(path)
    assert len(platform.pools) == pools
