"""The kubernetes section and scheduler.kind: contradictions refused at the field, with what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import SpecError
from infra.platform.resolve import load_platform


def _set(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        for path, value in changes.items():
            *parents, last = path.split("__")
            target = platform
            for key in parents:
                target = target.setdefault(key, {})
            if value is None:
                target.pop(last, None)
            else:
                target[last] = value

    return mutate


@pytest.mark.parametrize(
    ("base", "changes", "message"),
    [
        ("aws-k8s", {"kubernetes": None}, "scheduler.kind kueue runs on Kubernetes"),
        ("aws-k8s", {"scheduler__kind": "slurm"}, "set scheduler.kind: kueue"),
        ("aws-k8s", {"kubernetes__distribution": "existing"}, "does not run on backend aws"),
        ("onprem-k8s", {"kubernetes__distribution": "eks"}, "does not run on backend onprem"),
        ("onprem-k8s", {"kubernetes__autoscaler": "cluster-autoscaler"}, "use none"),
        ("onprem-k8s", {"kubernetes__admin_arns": ["arn:aws:iam::123456789012:role/admin"]}, "EKS access"),
        ("aws-k8s", {"kubernetes__context": "prod"}, "reach an existing cluster"),
        ("aws-k8s", {"scheduler__high_availability": True}, "Kubernetes runs its own control plane"),
        ("aws-k8s", {"kubernetes__version": "v1.34"}, "kubernetes.version"),
    ],
)
def test_contradictions_are_refused(
    write_stack: Callable[..., Path], base: str, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as error:
        load_platform(write_stack(base, _set(**changes)))
    assert message in error.value.message


def test_kueue_stacks_need_no_slurm_controller_shape(write_stack: Callable[..., Path]) -> None:
    """Slurm's one-or-two-controllers rule does not apply: the service pool hosts system pods."""
    platform = load_platform(
        write_stack("aws-k8s", _set(pools=None)) if False else write_stack("aws-k8s", _set())
    )
    assert platform.pool("system").spec.min_nodes == 2 and platform.pool("system").spec.max_nodes == 4
