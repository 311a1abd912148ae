"""placement-preferences on resolved platforms (infra/policy/rules/preferences.py): the pools a preference
names that are no training pool, listed whole, and a preference with nothing to choose between, which is
moot on Slurm only. Each test failed on a mutant of the rule the policy-rules session let through
(`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

from dataclasses import replace

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext
from infra.policy.rules.preferences import check_placement_preferences
from infra.policy.view import ResourceIndex


def preferring(platform: ResolvedPlatform, placement: list[str], *, roles: tuple[str, ...] = ()) -> list[str]:
    """The rule's messages when the first team prefers `placement` (and, with `roles`, the stack keeps only
    the pools of those roles, spot training pools among them)."""
    scheduler = platform.spec.scheduler
    teams = [scheduler.teams[0].model_copy(update={"placement": placement}), *scheduler.teams[1:]]
    spec = platform.spec.model_copy(update={"scheduler": scheduler.model_copy(update={"teams": teams})})
    pools = platform.pools
    if roles:
        pools = tuple(
            p for p in pools if p.role in roles and (p.role != "train" or p.spec.capacity == "spot")
        )
    changed = replace(platform, spec=spec, pools=pools)
    return [f.message for f in check_placement_preferences(ResourceIndex([]), PolicyContext(changed))]


def test_every_pool_a_preference_names_that_is_no_training_pool_is_listed(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    aws = shipped_platforms["aws-prod"]
    assert preferring(aws, ["train", "gone", "lost"]) == [
        "scheduler.teams[0] (research).placement names gone, lost, which is no training pool of the stack "
        "(training pools: train, train-spot)"
    ]
    assert preferring(aws, ["train"], roles=("service", "infer")) == [
        "scheduler.teams[0] (research).placement names train, which is no training pool of the stack "
        "(training pools: none)"
    ]


def test_a_preference_is_moot_on_slurm_with_one_gpu_type_or_none_on_demand_and_never_on_kueue(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """aws-prod's and aws-k8s's on-demand training pools hold one GPU type; with its training on spot only,
    aws-prod holds none on demand."""
    assert preferring(shipped_platforms["aws-prod"], ["train-spot"], roles=("service", "train")) == [
        "scheduler.teams[0] (research).placement has nothing to choose between: the on-demand training pools "
        "hold one GPU type (none), and on Slurm a preference orders GPU types"
    ]
    assert preferring(shipped_platforms["aws-k8s"], ["train"]) == []
