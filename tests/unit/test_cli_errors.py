"""Errors in one style and one problem each: click's usage errors in the tool's `error:` paragraph, a JSON
policy file reported as JSON, a misspelt key as one problem (not also its intended key as missing), a
number in quotes refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_cli import gpuplat


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("size",), "error: Missing option '--params'. (see `gpuplat size --help`)"),
        (("plan", "--bogus"), "error: No such option: --bogus"),
        (("nope",), "error: No such command 'nope'. (see `gpuplat --help`)"),
    ],
)
def test_usage_errors_are_one_paragraph_in_the_tools_style(args: tuple[str, ...], message: str) -> None:
    result = gpuplat(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(message)
    assert "Usage:" not in result.stderr and "Error:" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_malformed_json_policy_file_is_reported_as_json(tmp_path: Path) -> None:
    for name in ("policy.json", "policy.cfg"):  # by its name, or by its first character
        config = tmp_path / name
        config.write_text('{"budget-gpus": {"enforcementLevel": "advisory",}}\n')
        result = gpuplat("check", "--stack", "local", "--policy-config", str(config))
        assert result.returncode == 2
        assert f"{config}, line 1, column 49: not valid JSON: Expecting property name" in result.stderr
        assert "YAML" not in result.stderr


def _misspelt_budget(spec: dict[str, Any]) -> None:
    spec["budgett"] = spec.pop("budget")


def _quoted_gpus(spec: dict[str, Any]) -> None:
    spec["budget"]["max_gpus"] = "80"


def test_a_misspelt_key_is_one_problem(write_stack: Callable[..., Path]) -> None:
    result = gpuplat("check", "--stack-file", str(write_stack("onprem", _misspelt_budget)))
    assert result.returncode == 2
    assert ": 1 problem in the platform description:" in result.stderr
    assert (
        "budgett: unknown key (did you mean budget?)" in result.stderr
        and "Field required" not in result.stderr
    )


def test_a_number_in_quotes_is_refused(write_stack: Callable[..., Path]) -> None:
    result = gpuplat("check", "--stack-file", str(write_stack("onprem", _quoted_gpus)))
    assert result.returncode == 2
    assert "budget.max_gpus: must be a number, not text: write it without quotes (got '80')" in result.stderr


def test_a_command_group_alone_prints_its_help() -> None:
    for args in ((), ("serve",)):
        result = gpuplat(*args)
        assert result.returncode == 2 and result.stderr.startswith("Usage: gpuplat")
        assert "error:" not in result.stderr
