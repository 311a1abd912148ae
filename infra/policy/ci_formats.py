"""`gpuplat check` results for CI systems: SARIF 2.1.0 (code scanning annotates the stack file) and JUnit
XML (test reports: one test case per rule and stack).

A finding points at the stack file, and at the line of the pool it concerns where its resource names
one (`pool infer`, `aws-prod-infer-asg`); stack-wide findings point at the file alone.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from infra.policy.check import CheckReport
from infra.policy.rules import RULES
from infra.policy.rules.base import Verdict
from infra.policy.settings import PolicyConfig

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"mandatory": "error", "advisory": "warning"}


def pool_line(stack_text: str, pool: str) -> int | None:
    """The 1-based line of the pool's `name:` in the stack file."""
    pattern = re.compile(rf"^\s*(?:-\s*)?name:\s*['\"]?{re.escape(pool)}['\"]?\s*(?:#.*)?$")
    for number, line in enumerate(stack_text.splitlines(), start=1):
        if pattern.match(line):
            return number
    return None


def _pool_of(verdict: Verdict, stack: str, pools: Sequence[str]) -> str | None:
    for pool in sorted(pools, key=len, reverse=True):
        if verdict.resource in (f"pool {pool}", f"pool {pool!r}") or verdict.resource.startswith(
            f"{stack}-{pool}-"
        ):
            return pool
    return None


def _location(report: CheckReport, verdict: Verdict, pools: Sequence[str], base: Path) -> dict[str, Any]:
    source = Path(report.source)
    try:
        uri = source.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        uri = source.as_posix()
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    pool = _pool_of(verdict, report.stack, pools)
    if pool is not None and source.is_file():
        line = pool_line(source.read_text(encoding="utf-8"), pool)
        if line is not None:
            physical["region"] = {"startLine": line}
    return {
        "physicalLocation": physical,
        "logicalLocations": [{"name": verdict.resource, "kind": "resource"}],
    }


def sarif(reports: Iterable[tuple[CheckReport, Sequence[str]]], base: Path) -> dict[str, Any]:
    """One SARIF run of gpuplat over the stacks; `reports` pairs each report with its pool names."""
    rules = [
        {
            "id": rule.id,
            "shortDescription": {"text": rule.description},
            "help": {"text": rule.remediation},
            "defaultConfiguration": {"level": _LEVEL[rule.severity]},
            "properties": {"group": rule.group},
        }
        for rule in RULES
    ]
    index = {rule["id"]: number for number, rule in enumerate(rules)}
    results = [
        {
            "ruleId": verdict.rule,
            "ruleIndex": index[verdict.rule],
            "level": _LEVEL.get(verdict.severity, "note"),
            "message": {"text": f"{report.stack}: {verdict.resource}: {verdict.message}"},
            "locations": [_location(report, verdict, pools, base)],
        }
        for report, pools in reports
        for verdict in report.verdicts
    ]
    driver = {"name": "gpuplat", "version": version("gpu-platform"), "rules": rules}
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{"tool": {"driver": driver}, "results": results}],
    }


def junit(reports: Iterable[CheckReport], config: PolicyConfig) -> str:
    """A test suite per stack, a test case per rule: failed on a mandatory finding, passed with the
    advisory findings in its output, skipped where the config disables the rule."""
    suites = ET.Element("testsuites", name="gpuplat check")
    for report in reports:
        suite = ET.SubElement(suites, "testsuite", name=f"policy {report.stack}", file=report.source)
        failures = skipped = 0
        for rule in RULES:
            case = ET.SubElement(suite, "testcase", classname=f"gpuplat.policy.{rule.group}", name=rule.id)
            found = [v for v in report.verdicts if v.rule == rule.id]
            if config.enforcement.get(rule.id) == "disabled":
                ET.SubElement(case, "skipped", message="disabled by the policy config")
                skipped += 1
            elif any(v.severity == "mandatory" for v in found):
                failure = ET.SubElement(case, "failure", message=found[0].message, type="mandatory")
                failure.text = "\n".join(f"{v.resource}: {v.message} Fix: {v.remediation}" for v in found)
                failures += 1
            elif found:
                ET.SubElement(case, "system-out").text = "\n".join(
                    f"advisory: {v.resource}: {v.message}" for v in found
                )
        suite.set("tests", str(len(RULES)))
        suite.set("failures", str(failures))
        suite.set("skipped", str(skipped))
        suite.set("errors", "0")
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
