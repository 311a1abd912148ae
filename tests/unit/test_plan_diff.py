"""`gpuplat plan --base`: what changes between two revisions of a stack (a file or a git revision), as
text, JSON or a bounded markdown comment; bad bases exit 2 with one paragraph."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import infra.plan.snapshot as snapshot_module
from infra.errors import SpecError
from infra.plan import record as record_module
from infra.plan.diff import (
    MARKDOWN_ROWS,
    PlanDiff,
    ResourceChange,
    Totals,
    ValueChange,
    load_base,
    markdown,
    plan_diff,
    resource_changes,
)
from infra.plan.record import RecordedResource, Recording
from infra.plan.snapshot import resource_key, snapshot
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import CONFIG_KEY, stack_file
from tests.unit.test_cli import gpuplat

# Each stack recorded once per process: recording the program is most of these tests' time (infra.plan.record
# has tests of its own), and pytest run again in this process (mutmut's runs of them, one per mutant of
# infra.plan.diff, forked from the run that recorded: scripts/mutation/run.py) reuses them.
_RECORDED: dict[str, Recording] = {}


@pytest.fixture(autouse=True)
def _record_each_stack_once(monkeypatch: pytest.MonkeyPatch) -> None:
    record = record_module.record

    def once(platform: ResolvedPlatform) -> Recording:
        key = platform.spec.model_dump_json()
        if key not in _RECORDED:
            _RECORDED[key] = record(platform)
        return _RECORDED[key]

    monkeypatch.setattr(snapshot_module, "record", once)


def stack_document_pools(name: str) -> list[dict[str, Any]]:
    pools: list[dict[str, Any]] = yaml.safe_load(stack_file(name).read_text())["config"][CONFIG_KEY]["pools"]
    return pools


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
    changed = {(c["type"], c["name"]): c["values"] for c in diff["changes"]}
    infer = next(p for p in stack_document_pools("aws-prod") if p["name"] == "infer")
    assert changed[("aws:autoscaling/group:Group", "aws-prod-infer-asg")] == [
        {"field": "maxSize", "old": infer["max"], "new": 12}
    ]
    assert {"field": "pools[infer].max", "old": infer["max"], "new": 12} in diff["settings"]
    assert diff["after"]["gpus"] == diff["before"]["gpus"] + 4
    assert diff["after"]["usd_per_hour"] > diff["before"]["usd_per_hour"]


def test_a_git_revision_is_a_base(tmp_path: Path) -> None:
    """The repository's own HEAD: the shipped stack against itself changes nothing."""
    result = gpuplat("plan", "--stack", "aws-prod", "--base", "HEAD", "--format", "json")
    assert result.returncode == 0, result.stderr
    diff = json.loads(result.stdout)
    assert diff["base"] == "HEAD:stacks/Pulumi.aws-prod.yaml" and diff["changes"] == diff["settings"] == []


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


def _resource(type_: str, name: str, **inputs: Any) -> RecordedResource:
    return RecordedResource(type_, name, f"urn:pulumi:s::p::{type_}::{name}", inputs, None, True)


def _declared(recording: Recording) -> dict[str, dict[str, Any]]:
    return {resource_key(r.type, r.name): r.inputs for r in recording.resources}


def test_added_removed_and_changed_resources_by_type_and_name() -> None:
    """A resource is the same one before and after when its type and name are; a change lists the inputs
    that differ, one only before or only after included. Adds, then changes, then removes."""
    asg, lt = "aws:autoscaling/group:Group", "aws:ec2/launchTemplate:LaunchTemplate"
    before = Recording(
        [
            _resource(asg, "train-asg", maxSize=4, minSize=0),
            _resource(asg, "spot-asg", maxSize=2),
            _resource(lt, "train-lt", imageId="ami-1", userData="x"),
            _resource(lt, "kept", imageId="ami-1"),
        ]
    )
    after = Recording(
        [
            _resource(lt, "kept", imageId="ami-1"),
            _resource(asg, "train-asg", maxSize=8, minSize=0, tags={"a": "b"}),
            _resource(lt, "train-lt", imageId="ami-1"),
            _resource(asg, "infer-asg", maxSize=2),
            _resource(lt, "infer-lt", imageId="ami-2"),
        ]
    )
    assert resource_changes(_declared(before), _declared(after)) == [
        ResourceChange("add", asg, "infer-asg"),
        ResourceChange("add", lt, "infer-lt"),
        ResourceChange(
            "change",
            asg,
            "train-asg",
            fields=("maxSize", "tags.a"),
            values=(ValueChange("maxSize", 4, 8), ValueChange("tags.a", None, "b")),
        ),
        ResourceChange(
            "change", lt, "train-lt", fields=("userData",), values=(ValueChange("userData", "x", None),)
        ),
        ResourceChange("remove", asg, "spot-asg"),
    ]
    assert resource_changes(_declared(after), _declared(after)) == []
    assert [c.op for c in resource_changes(_declared(after), {})] == ["remove"] * 5


def test_the_diff_counts_each_operation_and_serialises_whole() -> None:
    changes = [
        ResourceChange("add", "t", "a"),
        ResourceChange("change", "t", "b", fields=("x",)),
        ResourceChange("remove", "t", "c"),
        ResourceChange("remove", "t", "d"),
    ]
    verdicts = [{"rule": "r", "severity": "mandatory", "resource": "x", "message": "m", "remediation": "f"}]
    settings = [ValueChange("budget.max_gpus", 8, 16)]
    diff = PlanDiff("s", "main", "head", Totals(3, 8, 1.5), Totals(2, 16, 2.5), changes, settings, verdicts)
    assert diff.counts() == {"add": 1, "change": 1, "remove": 2}
    assert diff.to_dict() == {
        "stack": "s",
        "base": "main",
        "head": "head",
        "base_code": "the base revision's",
        "before": {"resources": 3, "gpus": 8, "usd_per_hour": 1.5},
        "after": {"resources": 2, "gpus": 16, "usd_per_hour": 2.5},
        "counts": {"add": 1, "change": 1, "remove": 2},
        "changes": [
            {"op": "add", "type": "t", "name": "a", "fields": (), "values": ()},
            {"op": "change", "type": "t", "name": "b", "fields": ("x",), "values": ()},
            {"op": "remove", "type": "t", "name": "c", "fields": (), "values": ()},
            {"op": "remove", "type": "t", "name": "d", "fields": (), "values": ()},
        ],
        "settings": [{"field": "budget.max_gpus", "old": 8, "new": 16}],
        "policy": {"passed": False, "verdicts": verdicts},
    }


def test_the_markdown_comment_in_full() -> None:
    values = tuple(ValueChange(f"f{i}", i, i + 1) for i in range(8))
    changes = [
        ResourceChange("change", "aws:x/y:Z", "big", fields=tuple(v.field for v in values), values=values),
        ResourceChange("remove", "t", "old"),
    ]
    settings = [
        ValueChange("scheduler.teams[ml].gpu_quota", 24, 8),
        ValueChange("datasets[web]", None, "x" * 61),
    ]
    verdicts = [
        {"rule": "budget-gpus", "severity": "mandatory", "resource": "stack", "message": "16 > 8 | too many"},
        {"rule": "cost-spot", "severity": "advisory", "resource": "pool a", "message": "use spot"},
    ]
    diff = PlanDiff(
        "aws-prod", "main", "HEAD", Totals(10, 8, 1234.5), Totals(9, 16, 2469.0), changes, settings, verdicts
    )
    cells = "<br>".join(f"f{i}: `{i}` → `{i + 1}`" for i in range(6))
    assert markdown(diff) == (
        "### gpuplat plan: stack `aws-prod`\n"
        "\n"
        "Base `main` → head `HEAD`: **0 to add, 1 to change, 1 to remove**, 2 setting(s) changed\n"
        "\n"
        "| | before | after |\n"
        "|---|---:|---:|\n"
        "| resources | 10 | 9 |\n"
        "| GPUs at full size | 8 | 16 |\n"
        "| $/h at full size | 1,234.50 | 2,469.00 |\n"
        "\n"
        "**Policy: FAILED** (1 mandatory, 1 advisory findings)\n"
        "\n"
        "| severity | rule | resource | finding |\n"
        "|---|---|---|---|\n"
        "| mandatory | `budget-gpus` | `stack` | 16 > 8 \\| too many |\n"
        "| advisory | `cost-spot` | `pool a` | use spot |\n"
        "\n"
        "| setting | before | after |\n"
        "|---|---|---|\n"
        "| `scheduler.teams[ml].gpu_quota` | `24` | `8` |\n"
        "| `datasets[web]` | `-` | `(61 chars)` |\n"
        "\n"
        "| change | type | name | inputs |\n"
        "|---|---|---|---|\n"
        f"| change | `aws:x/y:Z` | `big` | {cells} … |\n"
        "| remove | `t` | `old` |  |\n"
        "\n"
        "<sub>Recorded offline (the program under the Pulumi SDK's mocks); the base planned with the base "
        "revision's code; cloud-computed values are not compared.</sub>\n"
    )
    nothing = markdown(PlanDiff("s", "a", "b", Totals(1, 0, 0.0), Totals(1, 0, 0.0)))
    assert "No resource changes.\n" in nothing and "| change |" not in nothing
    assert "**Policy: passed** (no findings)." in nothing and "| setting |" not in nothing
    cut = markdown(PlanDiff("s", "a", "b", Totals(0, 0, 0.0), Totals(2, 0, 0.0), changes, settings), limit=1)
    assert cut.count("| change | `") == 1 and "| remove |" not in cut
    assert "\n… and 1 more (`gpuplat plan --base` prints them all).\n" in cut
    assert "\n… and 1 more settings.\n" in cut and "datasets[web]" not in cut
    assert "more (`gpuplat plan --base`" not in markdown(replace(diff, changes=changes), limit=2)
    six, seven = (ResourceChange("change", "t", "n", values=values[:n]) for n in (6, 7))
    assert f"| {cells} |\n" in markdown(replace(diff, changes=[six]))
    assert f"| {cells} … |\n" in markdown(replace(diff, changes=[seven]))
    assert MARKDOWN_ROWS == 40


def _git(repository: Path, *args: str) -> str:
    command = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def test_base_revisions_without_the_stack_or_with_a_broken_one(tmp_path: Path) -> None:
    """A revision before the stack existed is an empty base (everything is added, nothing before); one
    whose stack does not parse is refused naming the revision's file, not a temporary copy."""
    repository = tmp_path / "platform"
    (repository / "stacks").mkdir(parents=True)
    _git(repository, "init", "-q", "-b", "main")
    (repository / "README").write_text("platform\n")
    _git(repository, "add", ".")
    _git(repository, "commit", "-q", "-m", "empty")
    stack = repository / "stacks" / "Pulumi.aws-prod.yaml"
    stack.write_text(yaml.safe_dump({"config": {"gpu-platform:platform": {"name": "aws-prod", "pools": 3}}}))
    _git(repository, "add", ".")
    _git(repository, "commit", "-q", "-m", "broken")
    stack.write_text(stack_file("aws-prod").read_text())

    assert load_base(stack, "main~1").snapshot is None
    assert load_base(stack, "main~1").label == "main~1 (no stacks/Pulumi.aws-prod.yaml there)"
    head = load_platform(stack)
    diff = plan_diff(None, snapshot(head), "main~1", str(stack))
    assert (diff.stack, diff.base, diff.head) == ("aws-prod", "main~1", str(stack))
    assert diff.before == Totals(0, 0, 0.0)
    assert diff.after.resources == len(diff.changes) > 0 and diff.after.gpus == head.total_gpus
    assert {c.op for c in diff.changes} == {"add"}

    with pytest.raises(SpecError) as broken:
        load_base(stack, "main")
    assert "main:stacks/Pulumi.aws-prod.yaml" in broken.value.message
    assert "gpuplat-base-" not in broken.value.message
    with pytest.raises(SpecError) as unknown:
        load_base(stack, "nowhere")
    assert unknown.value.message == (
        f"--base nowhere: neither a stack file nor a git revision of {repository} (give a file, or a branch, "
        "tag or commit such as origin/main)"
    )
    outside = tmp_path / "Pulumi.loose.yaml"
    outside.write_text(stack.read_text())
    with pytest.raises(SpecError) as no_repository:
        load_base(outside, "main")
    assert no_repository.value.message == (
        f"--base main: not a file, and {outside} is not in a git repository to read it from"
    )


def test_a_bad_base_is_refused_before_the_head_is_planned(tmp_path: Path) -> None:
    """The base is looked up first: a wrong --base costs no plan of the head (a head that does not even
    load shows it) and says so in one paragraph, without git's own words."""
    head = tmp_path / "Pulumi.aws-prod.yaml"
    head.write_text(yaml.safe_dump({"config": {"gpu-platform:platform": {"name": "aws-prod", "pools": 3}}}))
    result = gpuplat("plan", "--stack-file", str(head), "--base", "no-such-ref-xyz")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --base no-such-ref-xyz: not a file")
    assert "fatal:" not in result.stderr and "pools" not in result.stderr


@pytest.mark.parametrize(
    ("planner", "said"),
    [
        ("import time\ntime.sleep(30)\n", "did not finish in 2 s"),
        ("print('Pulumi: a warning on stdout')\n", "printed no plan"),
        ("print('[1, 2]')\n", "printed no plan"),
        ("print('{\"format\": 1}')\n", "lacks or adds fields"),
    ],
)
def test_a_base_planner_that_hangs_or_prints_no_plan_is_one_paragraph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planner: str, said: str
) -> None:
    """The base's own code is run as it is: one that hangs is stopped at the time limit, one whose output is
    not a plan is refused (exit 2, naming the revision), and its worktree is removed either way."""
    repository = tmp_path / "platform"
    (repository / "infra" / "plan").mkdir(parents=True)
    (repository / "stacks").mkdir()
    for package in ("infra", "infra/plan"):
        (repository / package / "__init__.py").write_text("")
    (repository / "infra" / "plan" / "snapshot.py").write_text(planner)
    stack = repository / "stacks" / "Pulumi.aws-prod.yaml"
    stack.write_text(stack_file("aws-prod").read_text())
    _git(repository, "init", "-q", "-b", "main")
    _git(repository, "add", ".")
    _git(repository, "commit", "-q", "-m", "a base whose planner misbehaves")
    monkeypatch.setattr("infra.plan.diff.SNAPSHOT_SECONDS", 2)

    with pytest.raises(SpecError) as refused:
        load_base(stack, "main")
    assert refused.value.message.startswith(
        "--base main:stacks/Pulumi.aws-prod.yaml: the base revision's code could not plan it: "
    )
    assert said in refused.value.message
    assert _git(repository, "worktree", "list", "--porcelain").count("worktree ") == 1
