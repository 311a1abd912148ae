"""`gpuplat plan --base`: what changes between two revisions of a stack (a file or a git revision), as
text, JSON or a bounded markdown comment; bad bases exit 2 with one paragraph."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from infra.plan.diff import PlanDiff, ResourceChange, Totals, markdown
from infra.spec.load import stack_file
from tests.unit.test_cli import gpuplat


def _grow_inference(spec: dict[str, Any]) -> None:
    next(p for p in spec["pools"] if p["name"] == "infer")["max"] = 12


def test_a_bigger_pool_shows_as_changed_resources_more_gpus_and_more_cost(
    write_stack: Callable[..., Path],
) -> None:
    head = write_stack("aws-prod", _grow_inference, name="aws-prod")
    result = gpuplat(
        "plan", "--stack-file", str(head), "--base", str(stack_file("aws-prod")), "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    diff = json.loads(result.stdout)
    assert diff["counts"] == {"add": 0, "change": diff["counts"]["change"], "remove": 0}
    changed = {(c["type"], c["name"]): c["fields"] for c in diff["changes"]}
    assert changed[("aws:autoscaling/group:Group", "aws-prod-infer-asg")] == ["maxSize"]
    assert diff["after"]["gpus"] == diff["before"]["gpus"] + 4
    assert diff["after"]["usd_per_hour"] > diff["before"]["usd_per_hour"]


def test_a_git_revision_is_a_base(tmp_path: Path) -> None:
    """The repository's own HEAD: the shipped stack against itself changes nothing."""
    result = gpuplat("plan", "--stack", "aws-prod", "--base", "HEAD", "--format", "json")
    assert result.returncode == 0, result.stderr
    diff = json.loads(result.stdout)
    assert diff["base"] == "HEAD:stacks/Pulumi.aws-prod.yaml" and diff["changes"] == []


def test_bad_bases_exit_2_with_one_paragraph(tmp_path: Path) -> None:
    unknown = gpuplat("plan", "--stack", "aws-prod", "--base", "no-such-ref-xyz")
    assert unknown.returncode == 2
    assert "--base no-such-ref-xyz: neither a stack file nor a git revision" in unknown.stderr
    broken = tmp_path / "Pulumi.aws-prod.yaml"
    broken.write_text(yaml.safe_dump({"config": {"gpu-platform:platform": {"name": "aws-prod", "pools": 3}}}))
    unparsable = gpuplat("plan", "--stack", "aws-prod", "--base", str(broken))
    assert unparsable.returncode == 2 and str(broken) in unparsable.stderr
    assert "Traceback" not in unknown.stderr + unparsable.stderr
    alone = gpuplat("plan", "--stack", "aws-prod", "--format", "markdown")
    assert alone.returncode == 2 and "give --base" in alone.stderr


def test_the_markdown_comment_is_bounded() -> None:
    changes = [ResourceChange("add", "aws:ec2/instance:Instance", f"node-{i}") for i in range(100)]
    text = markdown(
        PlanDiff("s", "main", "head", Totals(1, 8, 10.0), Totals(101, 16, 20.0), changes), limit=5
    )
    assert text.count("| add |") == 5 and "and 95 more" in text
    assert "| GPUs at full size | 8 | 16 |" in text
