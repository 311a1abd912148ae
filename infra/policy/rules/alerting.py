"""Alerts that reach someone: a production Slurm stack names where its Alertmanager sends them."""

from __future__ import annotations

from collections.abc import Iterator

from infra.policy.rules.base import Finding, PolicyContext, _stack_label
from infra.policy.view import ResourceIndex


def check_alert_receivers(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    platform = ctx.platform
    if platform is None or platform.spec.scheduler.kind != "slurm":
        return  # the Kubernetes layer routes its alerts through the cluster's own Alertmanager
    spec = platform.spec
    if spec.environment == "production" and not spec.alerting.webhook_urls:
        yield Finding(
            _stack_label(ctx),
            "a production stack whose alerts reach nobody: alerting.webhook_urls is empty, so the monitoring "
            "node's Alertmanager keeps them to itself (its UI on port 9093)",
        )
