"""The findings the policy test variants expect, word for word (tests/data/policy_findings.yaml)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infra.policy.rules import RULES_BY_ID, Verdict

FINDINGS = Path(__file__).resolve().parents[1] / "data" / "policy_findings.yaml"


@cache
def _expected() -> dict[str, dict[str, list[dict[str, Any]]]]:
    expected: dict[str, dict[str, list[dict[str, Any]]]] = yaml.safe_load(FINDINGS.read_text())
    return expected


def expected_findings(section: str, variant: str) -> list[dict[str, Any]]:
    return _expected()[section][variant]


def as_written(found: list[Verdict]) -> list[dict[str, Any]]:
    """The findings as the data file writes them; the remediation of each is its rule's, checked here."""
    for verdict in found:
        assert verdict.remediation == RULES_BY_ID[verdict.rule].remediation, verdict
    return [
        {
            "rule": v.rule,
            "severity": v.severity,
            "resource": v.resource,
            "message": v.message,
            **({"urn": v.urn} if v.urn else {}),
        }
        for v in found
    ]
