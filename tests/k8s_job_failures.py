"""What the Job controller does with a Job's failed pods, for the tests that hold a Job's podFailurePolicy,
backoffLimit and restartPolicy to what they cause (the guard Job's: tests/unit/test_guard_job_objects.py).

From the batch/v1 API's field docs (the kubernetes Python client 36.0.3's models, v1_job_spec.py and
v1_pod_failure_policy*.py, generated from the API's OpenAPI): the policy's rules are evaluated in order and
the first that matches a pod's failure decides; none: the default, the failure counted against
`backoffLimit` ("the number of retries before marking this job failed", so the Job fails on the failure
that makes the count exceed it). FailJob: the Job fails at once; Ignore: not counted, a replacement pod is
made; Count: counted. `onExitCodes` matches where a container (the named one, if `containerName`) ended
with a code In (or NotIn) its values, exit 0 never; `onPodConditions` where the pod has a condition of
that type and status (True when not given). An unknown action skips its rule; an unknown operator is
never satisfied ("Clients should react to an unknown ..."). A podFailurePolicy "cannot be used in
combination with restartPolicy=OnFailure" (JobSpec.podFailurePolicy): the API refuses it, as here.

Not modelled: FailIndex and indexed Jobs, the back-off delay between pods, activeDeadlineSeconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")


@dataclass(frozen=True)
class PodEnd:
    """How one of the Job's pods ended: each container's exit code, and its conditions (type: status)."""

    exit_codes: Mapping[str, int]
    conditions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobEnd:
    phase: str  # "Complete", "Failed" or "Running" (pods left to start)
    reason: str = ""
    pods: int = 0
    counted: int = 0


def _matches(rule: Mapping[str, Any], end: PodEnd) -> bool:
    codes = rule.get("onExitCodes")
    if codes is not None:
        wanted = codes.get("containerName")
        found = [c for name, c in end.exit_codes.items() if c != 0 and wanted in (None, name)]
        if not found:
            return False
        inside = [c in codes["values"] for c in found]
        if codes["operator"] == "In":
            return any(inside)
        return codes["operator"] == "NotIn" and not all(inside)  # an unknown operator: not satisfied
    return any(
        end.conditions.get(pattern["type"]) == (pattern.get("status") or "True")
        for pattern in rule.get("onPodConditions") or []
    )


def action(job_spec: Mapping[str, Any], end: PodEnd) -> str:
    """What the Job's pod failure policy does with a failed pod: FailJob, Ignore or Count."""
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules") or []:
        if rule.get("action") in ACTIONS and _matches(rule, end):  # an unknown action: the rule skipped
            return str(rule["action"])
    return "Count"


def run_job(job_spec: Mapping[str, Any], ends: Sequence[PodEnd]) -> JobEnd:
    """The Job's life over its pods' ends in turn (a pod whose containers all exit 0 completes it)."""
    template = job_spec["template"]["spec"]
    if job_spec.get("podFailurePolicy") and template.get("restartPolicy") != "Never":
        raise ValueError("a podFailurePolicy needs restartPolicy Never")
    counted = 0
    for pods, end in enumerate(ends, 1):
        if all(code == 0 for code in end.exit_codes.values()):
            return JobEnd("Complete", "", pods, counted)
        taken = action(job_spec, end)
        if taken == "FailJob":
            return JobEnd("Failed", "PodFailurePolicy", pods, counted)
        if taken == "Count":
            counted += 1
            if counted > int(job_spec.get("backoffLimit", 6)):
                return JobEnd("Failed", "BackoffLimitExceeded", pods, counted)
    return JobEnd("Running", "", len(ends), counted)
