"""Which stack file a command reads: --stack NAME finds stacks/ from the current directory (or one above
it), GPUPLAT_STACKS_DIR overrides it; a file name given to --stack is refused pointing at --stack-file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from infra.spec.load import CONFIG_KEY, stack_file
from tests.unit.test_cli import gpuplat


def _own_stack(directory: Path, name: str) -> Path:
    document = yaml.safe_load(stack_file("onprem").read_text())
    document["config"][CONFIG_KEY]["name"] = name
    path = directory / "stacks" / f"Pulumi.{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_stacks_are_found_from_the_current_directory_and_above(tmp_path: Path) -> None:
    path = _own_stack(tmp_path, "mine")
    below = tmp_path / "stacks" / "deeper"
    below.mkdir()
    for where in (tmp_path, below):
        result = gpuplat("check", "--stack", "mine", "--json", cwd=where)
        assert result.returncode == 0, result.stderr
        (report,) = json.loads(result.stdout)
        assert report["source"] == str(path)
    listed = gpuplat("stacks", "--json", cwd=tmp_path)
    assert [entry["stack"] for entry in json.loads(listed.stdout)] == ["mine"]
    everything = gpuplat("check", "--all", "--json", cwd=tmp_path)
    assert [r["stack"] for r in json.loads(everything.stdout)] == ["mine"]


def test_the_environment_variable_overrides_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _own_stack(tmp_path / "here", "here")
    elsewhere = _own_stack(tmp_path / "there", "there")
    monkeypatch.setattr("tests.unit.test_cli.cli_env", lambda: _env(elsewhere.parent))
    result = gpuplat("check", "--all", "--json", cwd=tmp_path / "here")
    assert [r["stack"] for r in json.loads(result.stdout)] == ["there"]


def _env(stacks: Path) -> dict[str, str]:
    return {"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"],
            "GPUPLAT_STACKS_DIR": str(stacks)}  # fmt: skip


@pytest.mark.parametrize("given", ["Pulumi.aws-prod.yaml", "stacks/Pulumi.aws-prod.yaml", "aws-prod.yml"])
def test_a_file_name_given_to_stack_points_at_stack_file(given: str) -> None:
    result = gpuplat("plan", "--stack", given)
    assert result.returncode == 2 and result.stdout == ""
    assert f"for a file give --stack-file {given}" in result.stderr
    assert "(aws-prod, for stacks/Pulumi.aws-prod.yaml)" in result.stderr
    assert "Pulumi.Pulumi" not in result.stderr


def test_stacks_and_plan_agree_on_the_cost_at_full_size() -> None:
    """One figure: the pools at full size and the services the program declares (aws-prod's FSx, NAT, ...)."""
    listed = {row["stack"]: row for row in json.loads(gpuplat("stacks", "--json").stdout)}
    planned = json.loads(gpuplat("plan", "--stack", "aws-prod", "--json").stdout)
    assert listed["aws-prod"]["usd_per_hour"] == planned["budget"]["usd_per_hour"]
    services = sum(s["usd_per_hour"] for s in planned["services"])
    assert services > 0 and planned["budget"]["usd_per_hour"] > services


def test_size_picks_from_the_stacks_own_backend_and_a_named_gpu() -> None:
    """An on-prem stack is sized on the on-prem node types, not an AWS instance type; --gpu narrows the
    catalog to one GPU model; a --provider against the stack and an unknown GPU are refused (exit 2)."""
    request = ("size", "--params", "7e9", "--dp", "16", "--zero", "3", "--json")
    onprem = json.loads(gpuplat(*request, "--stack", "onprem").stdout)
    assert onprem["node_plan"]["node_type"].startswith("hgx-")
    a100 = json.loads(gpuplat(*request, "--gpu", "a100").stdout)
    assert a100["node_plan"]["node_type"] in ("p4d.24xlarge", "p4de.24xlarge")
    unknown = gpuplat(*request, "--gpu", "V100")
    assert unknown.returncode == 2 and "--gpu: the aws catalog has no 'V100' GPU" in unknown.stderr
    against = gpuplat(*request, "--stack", "onprem", "--provider", "aws")
    assert against.returncode == 2 and "stack onprem is on the onprem backend" in against.stderr


def test_check_all_reports_a_bad_stack_and_still_checks_the_others(tmp_path: Path) -> None:
    """With --all, a stack file that does not load is that stack's error (exit 2, named with its field); the
    other stacks keep their reports, on stdout and in the --sarif and --junit files of the same run."""
    _own_stack(tmp_path, "good")
    (tmp_path / "stacks" / "Pulumi.bad.yaml").write_text(
        yaml.safe_dump({"config": {CONFIG_KEY: {"name": "bad", "pools": 3}}})
    )
    result = gpuplat(
        "check", "--all", "--json", "--sarif", "out/policy.sarif", "--junit", "out/policy.xml", cwd=tmp_path
    )
    assert result.returncode == 2
    assert "1 stack file(s) could not be checked (bad); 1 checked" in result.stderr
    by_stack = {entry["stack"]: entry for entry in json.loads(result.stdout)}
    assert sorted(by_stack) == ["bad", "good"]
    assert "pools" in by_stack["bad"]["error"] and "verdicts" in by_stack["good"]
    results = json.loads((tmp_path / "out" / "policy.sarif").read_text())["runs"][0]["results"]
    assert [r["ruleId"] for r in results if r["level"] == "error" and "bad:" in r["message"]["text"]] == [
        "stack-file-valid"
    ]
    junit = (tmp_path / "out" / "policy.xml").read_text()
    assert 'classname="gpuplat.policy.bad"' in junit
    assert "gpuplat.policy.good." in junit and 'type="stack-file"' in junit
