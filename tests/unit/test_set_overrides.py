"""`--set KEY=VALUE` on plan and check: a value over the stack file's, at the path the plan's setting
changes print, validated as the file is; the file itself untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.errors import SpecError
from infra.spec.load import stack_file
from infra.spec.overrides import apply_overrides
from tests.unit.test_cli import gpuplat


def test_overrides_set_keys_named_items_and_yaml_values() -> None:
    platform: dict[str, Any] = {"budget": {"max_gpus": 80}, "pools": [{"name": "a", "max": 1}, {"name": "b"}]}
    result = apply_overrides(platform, ["budget.max_gpus=8", "pools[b].max=3", "tags.team=ml", "x.y=true"])
    assert result == {
        "budget": {"max_gpus": 8},
        "pools": [{"name": "a", "max": 1}, {"name": "b", "max": 3}],
        "tags": {"team": "ml"},
        "x": {"y": True},
    }
    assert platform["budget"]["max_gpus"] == 80  # the file's mapping is left alone


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("budget.max_gpus", "give KEY=VALUE"),
        ("pools[c].max=3", "no pools item named 'c'; there are: a, b"),
        ("pools[a]=3", "name a field of pools[a]"),
        ("budget.max_gpus.deeper=3", "max_gpus holds a value, not keys"),
        ("bud get=3", "is not a key"),
    ],
)
def test_bad_overrides_are_refused(override: str, message: str) -> None:
    platform = {"budget": {"max_gpus": 80}, "pools": [{"name": "a"}, {"name": "b"}]}
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        apply_overrides(platform, [override])


def test_check_and_plan_take_overrides_and_validate_them() -> None:
    before = stack_file("onprem").read_text()
    broken = gpuplat("check", "--stack", "onprem", "--set", "budget.max_gpus=8", "--json")
    assert broken.returncode == 1 and json.loads(broken.stdout)[0]["verdicts"][0]["rule"] == "budget-gpus"
    diff = gpuplat(
        "plan", "--stack", "onprem", "--base", str(stack_file("onprem")), "--json",
        "--set", "scheduler.teams[research].gpu_quota=8",
    )  # fmt: skip
    assert {"field": "scheduler.teams[research].gpu_quota", "old": 24, "new": 8} in json.loads(diff.stdout)[
        "settings"
    ]
    quoted = gpuplat("check", "--stack", "onprem", "--set", 'budget.max_gpus="80"')
    assert quoted.returncode == 2 and 'with --set budget.max_gpus="80"' in quoted.stderr
    unknown = gpuplat("check", "--stack", "onprem", "--set", "budgett.max_gpus=8")
    assert unknown.returncode == 2 and "budgett: unknown key (did you mean budget?)" in unknown.stderr
    every = gpuplat("check", "--all", "--set", "budget.max_gpus=8")
    assert every.returncode == 2 and "--set sets a value of one stack" in every.stderr
    deployed = gpuplat("plan", "--stack", "aws-prod", "--deployed", "--set", "budget.max_gpus=8")
    assert deployed.returncode == 2 and "not what is deployed" in deployed.stderr
    assert stack_file("onprem").read_text() == before
