"""`gpuplat plan --deployed --refresh`: drift, what `pulumi refresh --preview-only` finds changed outside
Pulumi, beside what `pulumi up` would change; the Automation API's stack stood in for (no cloud here:
what a real refresh reads back is Pulumi's, not modelled)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from infra.lifecycle import cloud_stack
from tests.unit.test_cli import gpuplat


class _Deployed:
    name = "aws-prod"

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def refresh(self, *, preview_only: bool | None = None, on_output: Any = None) -> Any:
        self.calls.append(f"refresh preview_only={preview_only}")
        on_output("~ aws:ec2/securityGroup:SecurityGroup aws-prod-nodes-sg refresh")
        return SimpleNamespace(
            summary=SimpleNamespace(resource_changes={"update": 2, "delete": 1, "same": 130})
        )

    def preview(self, *, diff: bool | None = None, on_output: Any = None) -> Any:
        self.calls.append("preview")
        return SimpleNamespace(change_summary={"update": 3, "same": 130})


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(cloud_stack, "open_stack", lambda platform, action, create: _Deployed(seen))
    return seen


def test_drift_is_read_without_writing_the_state_and_shown_beside_the_preview(calls: list[str]) -> None:
    text = gpuplat("plan", "--stack", "aws-prod", "--deployed", "--refresh")
    assert text.returncode == 0, text.stderr
    assert calls == ["refresh preview_only=True", "preview"]
    assert (
        "Drift of the deployed stack: 2 changed outside Pulumi, 1 gone (pulumi refresh records it"
        in text.stdout
    )
    assert "Against the deployed stack: 3 to update; 130 unchanged" in text.stdout
    assert "aws-prod-nodes-sg refresh" in text.stderr  # Pulumi's own lines go to stderr as they come
    data = json.loads(gpuplat("plan", "--stack", "aws-prod", "--deployed", "--refresh", "--json").stdout)
    assert data["drift"] == {"update": 2, "delete": 1, "same": 130}
    assert data["deployed_changes"] == {"update": 3, "same": 130}


def test_refresh_needs_deployed(calls: list[str]) -> None:
    result = gpuplat("plan", "--stack", "aws-prod", "--refresh")
    assert result.returncode == 2 and "give it with --deployed" in result.stderr and calls == []


def test_no_drift_says_so() -> None:
    assert cloud_stack.Drift({"same": 5}).line() == "no drift; 5 resources as recorded"


def test_the_stack_file_reaches_refresh_too() -> None:
    seen: dict[str, Any] = {}

    class Stack:
        name = "s"

        def refresh(self, **options: Any) -> Any:
            seen.update(options)
            return SimpleNamespace(summary=None)

    drift = cloud_stack.drift(
        cloud_stack.FromStackFile(Stack(), "/elsewhere/Pulumi.s.yaml"), lambda line: None
    )
    assert seen["config_file"] == "/elsewhere/Pulumi.s.yaml" and seen["preview_only"] is True
    assert drift.counts == {}
