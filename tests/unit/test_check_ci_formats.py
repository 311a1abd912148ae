"""`gpuplat check --format sarif|junit`: SARIF validated against the OASIS SARIF 2.1.0 schema (stored in
tests/data/upstream/sarif), findings on the line of the pool they concern; JUnit with a failed test case
per broken mandatory rule."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from infra.policy.ci_formats import pool_line
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
    assert taint["region"]["startLine"] == pool_line(path.read_text(), "infer")
    assert "region" not in by_rule["budget-gpus"]["locations"][0]["physicalLocation"]  # stack-wide


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
    skipped = {case.get("name") for case in suite.iter("testcase") if case.find("skipped") is not None}
    assert skipped == {"alerts-reach-someone"}
    assert suite.get("failures") == "2" and suite.get("skipped") == "1"


def test_an_unknown_format_is_bad_input() -> None:
    result = gpuplat("check", "--stack", "local", "--format", "xml")
    assert result.returncode == 2 and "give one of text, json, sarif, junit" in result.stderr
