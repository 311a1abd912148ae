"""`gpuplat check` results for CI systems: SARIF 2.1.0 (code scanning annotates the stack file) and JUnit
XML (test reports: one test case per rule and stack).

A finding points at the stack file: at the line of the pool it concerns where its resource names one
(`pool infer`, `aws-prod-infer-asg`), else at the line of the platform's settings (a stack-wide finding:
the budget, the fabric). A stack whose file could not be checked is one error result (SARIF) and one
errored test case (JUnit); the other stacks keep theirs.

GitHub code scanning matches a result across runs by its rule, its file path and `partialFingerprints`
(docs.github.com/en/code-security/reference/code-scanning/sarif-files/sarif-support-for-code-scanning,
"Data for preventing duplicated alerts"): the paths are relative to the directory the check ran in (the
repository's root in CI) and the fingerprint is the finding's identity (rule, stack, resource, pool), not
its line, so an edit above a pool keeps its alerts. `primaryLocationLineHash` is left to GitHub, which
computes it from the file's text.
"""

from __future__ import annotations

import hashlib
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from infra.policy.check import CheckReport, StackProblem
from infra.policy.rules import RULES
from infra.policy.rules.base import Verdict
from infra.policy.settings import PolicyConfig
from infra.spec.load import CONFIG_KEY

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"mandatory": "error", "advisory": "warning"}
FINGERPRINT = "gpuplatFinding/v1"
STACK_FILE_RULE = "stack-file-valid"  # the result of a stack that could not be checked
SOURCE_ROOT = "%SRCROOT%"

Outcome = CheckReport | StackProblem


def pool_line(stack_text: str, pool: str) -> int | None:
    """The 1-based line of the pool's `name:` in the stack file."""
    pattern = re.compile(rf"^\s*(?:-\s*)?name:\s*['\"]?{re.escape(pool)}['\"]?\s*(?:#.*)?$")
    for number, line in enumerate(stack_text.splitlines(), start=1):
        if pattern.match(line):
            return number
    return None


def settings_line(stack_text: str) -> int:
    """The 1-based line of the platform's settings key (where a stack-wide finding points), else 1."""
    key = re.compile(rf"^\s*['\"]?{re.escape(CONFIG_KEY)}['\"]?\s*:")
    return next((n for n, line in enumerate(stack_text.splitlines(), start=1) if key.match(line)), 1)


def _pool_of(verdict: Verdict, stack: str, pools: Sequence[str]) -> str | None:
    for pool in sorted(pools, key=len, reverse=True):
        if verdict.resource in (f"pool {pool}", f"pool {pool!r}") or verdict.resource.startswith(
            f"{stack}-{pool}-"
        ):
            return pool
    return None


def relative_path(source: str, base: Path) -> str:
    """The stack file's path relative to `base` (the directory the check ran in); a file elsewhere keeps the
    path it was given, made relative to `base` with `..` so no absolute path reaches a report."""
    path = Path(source)
    resolved = path.resolve() if path.is_absolute() or path.exists() else base / path
    try:
        return resolved.relative_to(base.resolve()).as_posix()
    except ValueError:
        return Path(os.path.relpath(resolved, base.resolve())).as_posix()


def _text(source: str) -> str:
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    except OSError:
        return ""


def fingerprint(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def _result(
    rule_id: str, index: int, level: str, message: str, uri: str, line: int, logical: str, identity: str
) -> dict[str, Any]:
    return {
        "ruleId": rule_id,
        "ruleIndex": index,
        "level": level,
        "message": {"text": message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": uri, "uriBaseId": SOURCE_ROOT},
                    "region": {"startLine": line},
                },
                "logicalLocations": [{"name": logical, "kind": "resource"}],
            }
        ],
        "partialFingerprints": {FINGERPRINT: fingerprint(rule_id, identity)},  # not the path: moves keep it
    }


def _results(outcome: Outcome, index: dict[str, int], base: Path) -> list[dict[str, Any]]:
    uri = relative_path(outcome.source, base)
    text = _text(outcome.source)
    if isinstance(outcome, StackProblem):
        message = f"{outcome.stack}: the stack file could not be checked: {outcome.message}"
        rule_index = index[STACK_FILE_RULE]
        return [_result(STACK_FILE_RULE, rule_index, "error", message, uri, 1, outcome.stack, outcome.stack)]
    results = []
    seen: dict[str, int] = {}
    for verdict in outcome.verdicts:
        pool = _pool_of(verdict, outcome.stack, outcome.pools)
        identity = "\x1f".join((outcome.stack, verdict.resource, pool or ""))
        seen[verdict.rule + identity] = repeat = seen.get(verdict.rule + identity, -1) + 1
        line = (pool_line(text, pool) if pool else None) or settings_line(text)
        results.append(
            _result(
                verdict.rule,
                index[verdict.rule],
                _LEVEL.get(verdict.severity, "note"),
                f"{outcome.stack}: {verdict.resource}: {verdict.message}",
                uri,
                line,
                verdict.resource,
                f"{identity}\x1f{repeat}",  # a second finding of one rule on one resource: its own
            )
        )
    return results


def sarif(outcomes: Iterable[Outcome], base: Path) -> dict[str, Any]:
    """One SARIF run of gpuplat over the stacks, paths relative to `base` (%SRCROOT%)."""
    rules: list[dict[str, Any]] = [
        {
            "id": rule.id,
            "shortDescription": {"text": rule.description},
            "help": {"text": rule.remediation},
            "defaultConfiguration": {"level": _LEVEL[rule.severity]},
            "properties": {"group": rule.group},
        }
        for rule in RULES
    ]
    rules.append(
        {
            "id": STACK_FILE_RULE,
            "shortDescription": {"text": "the stack file parses and validates, so it can be checked"},
            "help": {"text": "fix the field the message names (docs/stack-format.md)"},
            "defaultConfiguration": {"level": "error"},
            "properties": {"group": "stack"},
        }
    )
    index = {rule["id"]: number for number, rule in enumerate(rules)}
    outcomes = list(outcomes)
    results = [result for outcome in outcomes for result in _results(outcome, index, base)]
    problems = [o for o in outcomes if isinstance(o, StackProblem)]
    driver = {"name": "gpuplat", "version": version("gpu-platform"), "rules": rules}
    invocation = {
        "executionSuccessful": not problems,
        "toolExecutionNotifications": [
            {"level": "error", "message": {"text": f"{p.stack}: {p.message}"}} for p in problems
        ],
    }
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": driver},
                "originalUriBaseIds": {SOURCE_ROOT: {"uri": base.resolve().as_uri() + "/"}},
                "invocations": [invocation],
                "results": results,
            }
        ],
    }


def junit(outcomes: Iterable[Outcome], config: PolicyConfig, base: Path) -> str:
    """A test suite per stack, a test case per rule (class name `gpuplat.policy.STACK.GROUP`, unique across
    stacks): failed on a mandatory finding, passed with the advisory findings in its output, skipped where
    the config disables the rule or no resource of the stack is of a kind it judges. A stack that could not
    be checked is a suite of one errored case."""
    suites = ET.Element("testsuites", name="gpuplat check")
    total_time = 0.0
    for outcome in outcomes:
        file = relative_path(outcome.source, base)
        suite = ET.SubElement(suites, "testsuite", name=f"policy {outcome.stack}", file=file)
        if isinstance(outcome, StackProblem):
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"gpuplat.policy.{outcome.stack}",
                name=STACK_FILE_RULE,
                file=file,
            )
            case.set("time", "0.000")
            ET.SubElement(case, "error", message=outcome.message, type="stack-file").text = outcome.message
            suite.attrib.update(tests="1", failures="0", skipped="0", errors="1", time="0.000")
            continue
        failures = skipped = 0
        for rule in RULES:
            case = ET.SubElement(
                suite, "testcase", classname=f"gpuplat.policy.{outcome.stack}.{rule.group}", name=rule.id
            )
            case.set("file", file)
            case.set("time", f"{outcome.seconds.get(rule.id, 0.0):.3f}")
            found = [v for v in outcome.verdicts if v.rule == rule.id]
            if config.enforcement.get(rule.id) == "disabled":
                ET.SubElement(case, "skipped", message="disabled by the policy config")
                skipped += 1
            elif any(v.severity == "mandatory" for v in found):
                failure = ET.SubElement(case, "failure", message=found[0].message, type="mandatory")
                failure.text = "\n".join(f"{v.resource}: {v.message} Fix: {v.remediation}" for v in found)
                failures += 1
            elif rule.id in outcome.not_applicable:
                ET.SubElement(case, "skipped", message="no resource of this stack is of a kind it judges")
                skipped += 1
            elif found:
                ET.SubElement(case, "system-out").text = "\n".join(
                    f"advisory: {v.resource}: {v.message}" for v in found
                )
        seconds = outcome.total_seconds or sum(outcome.seconds.values())
        total_time += seconds
        suite.attrib.update(
            tests=str(len(RULES)),
            failures=str(failures),
            skipped=str(skipped),
            errors="0",
            time=f"{seconds:.3f}",
        )
    suites.set("time", f"{total_time:.3f}")
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
