"""`gpuplat check --format sarif|junit`: SARIF validated against the OASIS SARIF 2.1.0 schema (stored in
tests/data/upstream/sarif), findings on the line of the pool they concern; JUnit with a failed test case
per broken mandatory rule."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from infra.cli.commands.check import _write_whole
from infra.errors import SpecError
from infra.policy.check import CheckReport
from infra.policy.ci_formats import FINGERPRINT, junit, pool_line, sarif, settings_line
from infra.policy.rules import RULES, Verdict
from infra.policy.settings import PolicyConfig
from tests.unit.test_cli import gpuplat
from tests.upstream import UPSTREAM

SARIF_SCHEMA = json.loads((UPSTREAM / "sarif" / "sarif-schema-2.1.0.json").read_text())


def _untainted_and_over_budget(spec: dict[str, Any]) -> None:
    spec["budget"]["max_gpus"] = 8
    next(p for p in spec["pools"] if p["name"] == "infer")["taints"] = []


def test_sarif_is_valid_and_points_at_the_pool(write_stack: Callable[..., Path]) -> None:
    path = write_stack("onprem", _untainted_and_over_budget, name="broken")
    result = gpuplat("check", "--stack-file", str(path), "--format", "sarif")
    assert result.returncode == 1, result.stderr  # the verdict does not depend on the format
    document = json.loads(result.stdout)
    jsonschema.validate(document, SARIF_SCHEMA)
    (run,) = document["runs"]
    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert by_rule["budget-gpus"]["level"] == "error"
    taint = by_rule["isolation-inference-taint"]["locations"][0]["physicalLocation"]
    assert taint["artifactLocation"]["uri"].endswith("Pulumi.broken.yaml")
    assert not taint["artifactLocation"]["uri"].startswith("/")  # relative, to %SRCROOT%
    assert taint["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
    assert taint["region"]["startLine"] == pool_line(path.read_text(), "infer")
    budget = by_rule["budget-gpus"]["locations"][0]["physicalLocation"]  # stack-wide: the settings' line
    assert (
        budget["region"] == {"startLine": settings_line(path.read_text())}
        and budget["region"]["startLine"] > 1
    )


def test_sarif_of_passing_stacks_is_valid_and_empty() -> None:
    result = gpuplat("check", "--all", "--format", "sarif")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, SARIF_SCHEMA)
    assert document["runs"][0]["results"] == []


def test_junit_fails_the_broken_rules_and_skips_disabled_ones(
    write_stack: Callable[..., Path], tmp_path: Path
) -> None:
    path = write_stack("onprem", _untainted_and_over_budget, name="broken")
    config = tmp_path / "policy.yaml"
    config.write_text("alerts-reach-someone: disabled\n")
    result = gpuplat("check", "--stack-file", str(path), "--policy-config", str(config), "--format", "junit")
    assert result.returncode == 1
    suite = ET.fromstring(result.stdout).find("testsuite")
    assert suite is not None
    failed = {case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None}
    assert failed == {"budget-gpus", "isolation-inference-taint"}
    skipped = {
        case.get("name"): case.find("skipped").get("message")  # type: ignore[union-attr]
        for case in suite.iter("testcase")
        if case.find("skipped") is not None
    }
    assert skipped.pop("alerts-reach-someone") == "disabled by the policy config"
    # An on-prem stack declares no EC2 instance, bucket or security group: those rules judged nothing.
    assert {"security-imdsv2", "security-ebs-encrypted", "security-no-open-ingress"} <= set(skipped)
    assert set(skipped.values()) == {"no resource of this stack is of a kind it judges"}
    assert suite.get("failures") == "2" and suite.get("skipped") == str(len(skipped) + 1)


def test_an_unknown_format_is_bad_input() -> None:
    result = gpuplat("check", "--stack", "local", "--format", "xml")
    assert result.returncode == 2 and "give one of text, json, sarif, junit" in result.stderr


def _on_demand_spot_pool(spec: dict[str, Any]) -> None:
    next(p for p in spec["pools"] if p["name"] == "train-spot")["capacity"] = "on-demand"


def test_sarif_points_a_resource_at_its_own_pool_not_one_its_name_extends(
    write_stack: Callable[..., Path],
) -> None:
    """aws-prod-train-spot-lt is pool train-spot's, though its name starts with pool train's prefix too."""
    path = write_stack("aws-prod", _on_demand_spot_pool, name="aws-prod")
    result = gpuplat("check", "--stack-file", str(path), "--format", "sarif")
    assert result.returncode == 1, result.stderr
    (finding,) = json.loads(result.stdout)["runs"][0]["results"]
    (location,) = finding["locations"]
    assert location["logicalLocations"] == [{"name": "aws-prod-train-spot-lt", "kind": "resource"}]
    text = path.read_text()
    assert location["physicalLocation"]["region"] == {"startLine": pool_line(text, "train-spot")}
    assert pool_line(text, "train-spot") != pool_line(text, "train")


def test_pool_line_is_the_1_based_line_of_the_pools_name() -> None:
    text = "pools:\n  - name: head\n  - name: 'infer'  # serving\n  - name: infer-big\n    role: infer\n"
    assert pool_line(text, "head") == 2
    assert pool_line(text, "infer") == 3
    assert pool_line(text, "infer-big") == 4
    assert pool_line(text, "train") is None


def _verdict(rule: str, severity: str, resource: str, message: str) -> Verdict:
    return Verdict(rule, severity, resource, message, remediation=f"fix {rule}")


def test_sarif_rules_carry_their_group_and_findings_their_level(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.s.yaml"
    stack.write_text("config:\n  gpu-platform:platform:\n    pools:\n      - name: infer\n")
    verdicts = [
        _verdict("isolation-inference-taint", "mandatory", "pool infer", "untainted"),
        _verdict("spot-training-share", "advisory", "s-infer-asg", "a share"),
        _verdict("spot-training-share", "informational", "stack s", "a note"),
    ]
    document = sarif([CheckReport("s", "onprem", str(stack), 3, verdicts, pools=("infer",))], tmp_path)
    (run,) = document["runs"]
    assert run["tool"]["driver"]["name"] == "gpuplat"
    assert run["tool"]["driver"]["version"] == version("gpu-platform")
    groups = {rule["id"]: rule["properties"] for rule in run["tool"]["driver"]["rules"]}
    assert groups["spot-training-share"] == {"group": "spot"} and len(groups) == len(RULES) + 1
    assert groups["stack-file-valid"] == {"group": "stack"}
    assert [r["level"] for r in run["results"]] == ["error", "warning", "note"]
    file = {"uri": "Pulumi.s.yaml", "uriBaseId": "%SRCROOT%"}
    assert [r["locations"][0]["physicalLocation"] for r in run["results"]] == [
        {"artifactLocation": file, "region": {"startLine": 4}},
        {"artifactLocation": file, "region": {"startLine": 4}},
        {"artifactLocation": file, "region": {"startLine": 2}},
    ]
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": tmp_path.resolve().as_uri() + "/"}}
    assert run["results"][0]["message"] == {"text": "s: pool infer: untainted"}
    assert run["invocations"] == [{"executionSuccessful": True, "toolExecutionNotifications": []}]


def test_sarif_fingerprints_are_stable_and_follow_the_finding(tmp_path: Path) -> None:
    """The same findings give the same fingerprints on every run, wherever the check runs from and wherever
    the stack file moves; an edit above the pool (its line moves) keeps them; the finding moving to another
    pool or resource changes it."""
    stack = tmp_path / "Pulumi.s.yaml"
    text = "config:\n  gpu-platform:platform:\n    pools:\n      - name: infer\n      - name: infer2\n"
    stack.write_text(text)

    def prints(*verdicts: Verdict, base: Path = tmp_path) -> list[str]:
        report = CheckReport("s", "onprem", str(stack), 3, list(verdicts), pools=("infer", "infer2"))
        return [r["partialFingerprints"][FINGERPRINT] for r in sarif([report], base)["runs"][0]["results"]]

    on_infer = _verdict("isolation-inference-taint", "mandatory", "pool infer", "untainted")
    first = prints(on_infer)
    assert first == prints(on_infer) and len(first[0]) == 32
    assert prints(on_infer, base=tmp_path.parent) == first  # run from another directory
    (tmp_path / "moved").mkdir()
    stack = stack.rename(tmp_path / "moved" / stack.name)
    assert prints(on_infer) == first  # the stack file moved, the finding did not
    stack.write_text("# a comment above everything\n" + text)
    assert prints(on_infer) == first  # the line moved, the finding did not
    moved = _verdict("isolation-inference-taint", "mandatory", "pool infer2", "untainted")
    assert prints(moved) != first
    other_rule = _verdict("budget-gpus", "mandatory", "pool infer", "untainted")
    assert prints(other_rule) != first
    twice = prints(on_infer, on_infer)
    assert len(set(twice)) == 2 and twice[0] == first[0]  # two findings, two alerts


def test_junit_names_its_suites_cases_failures_and_skips(tmp_path: Path) -> None:
    verdicts = [
        _verdict("budget-gpus", "mandatory", "stack p", "too many GPUs"),
        _verdict("budget-gpus", "mandatory", "pool train", "and here"),
        _verdict("spot-training-share", "advisory", "pool train-spot", "a large share"),
    ]
    config = PolicyConfig(enforcement={"alerts-reach-someone": "disabled", "budget-hourly-cost": "disabled"})
    report = CheckReport(
        "p", "onprem", str(tmp_path / "stacks/Pulumi.p.yaml"), 5, verdicts,
        not_applicable=("security-imdsv2",), seconds={"budget-gpus": 0.25}, total_seconds=1.5,
    )  # fmt: skip
    text = junit([report], config, tmp_path)
    assert text.startswith(
        "<?xml version='1.0' encoding='utf-8'?>\n<testsuites name=\"gpuplat check\" time=\"1.500\">"
    )
    root = ET.fromstring(text)
    (suite,) = root.iter("testsuite")
    assert suite.attrib == {
        "name": "policy p",
        "file": "stacks/Pulumi.p.yaml",
        "tests": str(len(RULES)),
        "failures": "1",
        "skipped": "3",
        "errors": "0",
        "time": "1.500",
    }
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert cases["budget-gpus"].attrib == {
        "classname": "gpuplat.policy.p.budget",
        "name": "budget-gpus",
        "file": "stacks/Pulumi.p.yaml",
        "time": "0.250",
    }
    failure = cases["budget-gpus"].find("failure")
    assert failure is not None and failure.attrib == {"message": "too many GPUs", "type": "mandatory"}
    assert (
        failure.text
        == "stack p: too many GPUs Fix: fix budget-gpus\npool train: and here Fix: fix budget-gpus"
    )
    skipped = cases["budget-hourly-cost"].find("skipped")
    assert skipped is not None and skipped.attrib == {"message": "disabled by the policy config"}
    not_applicable = cases["security-imdsv2"].find("skipped")
    assert not_applicable is not None and "judges" in not_applicable.get("message", "")
    output = cases["spot-training-share"].find("system-out")
    assert output is not None and output.text == "advisory: pool train-spot: a large share"
    assert list(cases["spot-training-share"]) == [output]  # an advisory finding does not fail the case


def test_junit_of_every_stack_has_unique_case_ids_relative_files_and_times() -> None:
    result = gpuplat("check", "--all", "--format", "junit")
    assert result.returncode == 0, result.stderr
    cases = list(ET.fromstring(result.stdout).iter("testcase"))
    ids = [(case.get("classname"), case.get("name")) for case in cases]
    assert len(ids) == len(set(ids)) > len(RULES)
    assert all(not case.get("file", "/").startswith("/") for case in cases)
    suites = list(ET.fromstring(result.stdout).iter("testsuite"))
    assert all(float(suite.get("time", "-1")) > 0 for suite in suites)


def test_conflicting_format_flags_are_refused() -> None:
    """--json is --format json: beside another --format it is two answers to one question (exit 2, nothing
    on stdout); beside --format json it is the same answer."""
    for command in (("plan", "--stack", "local", "--base", "HEAD"), ("check", "--stack", "local")):
        other = "markdown" if command[0] == "plan" else "sarif"
        refused = gpuplat(*command, "--json", "--format", other)
        assert refused.returncode == 2 and refused.stdout == ""
        assert f"--json and --format {other} ask for two formats" in refused.stderr
    text = gpuplat("check", "--stack", "local", "--json", "--format", "text")
    assert text.returncode == 2
    same = gpuplat("check", "--stack", "local", "--json", "--format", "json")
    assert same.returncode == 0 and json.loads(same.stdout)[0]["stack"] == "local"


def test_a_report_that_fails_halfway_leaves_the_last_one_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--sarif/--junit write beside the report and rename: a write that fails halfway (disk full) leaves the
    previous report as it was and no partial file, and is one paragraph (exit 2)."""
    report = tmp_path / "reports" / "policy.sarif"
    _write_whole(report, "the last run's report\n")
    assert report.read_text() == "the last run's report\n"

    def half_then_full(self: Path, text: str, encoding: str | None = None) -> int:
        with self.open("w", encoding=encoding) as handle:
            handle.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(SpecError) as full:
        _write_whole(report, "this run's report, cut short\n")
    assert full.value.exit_code == 2 and "No space left on device" in full.value.message
    assert report.read_text() == "the last run's report\n"
    assert sorted(p.name for p in report.parent.iterdir()) == ["policy.sarif"]
