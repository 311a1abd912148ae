"""The gateway's canary program (roles/inference_gateway/files/gpuplat_gateway_canary.py): the version map
for a share and the entries a change sets. Against HAProxy itself, through `gpuplat serve`:
tests/serving/test_serve.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import load_script

FILES = Path(__file__).resolve().parents[2] / "roles" / "inference_gateway" / "files"


@pytest.fixture(scope="module")
def canary() -> ModuleType:
    sys.path.insert(0, str(FILES))  # it imports the runtime API client of gpuplat_gateway_targets.py
    try:
        return load_script(FILES / "gpuplat_gateway_canary.py")
    finally:
        sys.path.remove(str(FILES))


@given(percent=st.integers(min_value=0, max_value=100))
def test_the_version_map_gives_the_canary_its_share_of_draws(canary: ModuleType, percent: int) -> None:
    entries = canary.version_map(percent)
    assert sorted(entries) == list(range(canary.DRAWS))
    assert sum(backend == canary.CANARY for backend in entries.values()) == percent


def test_moving_the_share_sets_only_the_draws_that_change(canary: ModuleType) -> None:
    at_20 = canary.version_map(20)
    assert canary.map_changes(at_20, canary.version_map(25)) == [(d, canary.CANARY) for d in range(20, 25)]
    assert canary.map_changes(at_20, at_20) == []
    assert canary.map_changes(at_20, canary.version_map(0)) == [(d, canary.STABLE) for d in range(20)]


def test_a_share_is_a_whole_percentage(canary: ModuleType) -> None:
    with pytest.raises(ValueError, match="0 to 100"):
        canary.version_map(101)


def test_show_map_lines_are_read_by_key(canary: ModuleType) -> None:
    text = "0x5581c1a0e2d0 0 inference_canary\n0x5581c1a0e310 1 inference\n\n"
    assert canary.parse_map(text) == {0: "inference_canary", 1: "inference"}
