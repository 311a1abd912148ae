"""fs-zone on hand-made subnets (infra/policy/rules/placement.py check_filesystem_zone): subnets whose zone
is missing or unknown (a preview) say nothing, and the finding lists each training pool's zones. Each
test failed on a mutant of the rule the policy-rules session let through (`make mutation`,
docs/developing.md#mutation-score)."""

from __future__ import annotations

from infra.policy.rules import PolicyContext
from infra.policy.rules.placement import check_filesystem_zone
from infra.policy.rules.resource_types import ASG, LUSTRE, SUBNET
from infra.policy.view import TAG_POOL, TAG_ROLE, UNKNOWN, ResourceIndex, ResourceView


def subnet(name: str, zone: str | None) -> ResourceView:
    props = {"availabilityZone": zone} if zone is not None else {}
    return ResourceView(SUBNET, name, props, urn=f"urn:{name}", ids=frozenset({name}))


def training(pool: str, *subnets: str) -> ResourceView:
    tags = [{"key": TAG_ROLE, "value": "train"}, {"key": TAG_POOL, "value": pool}]
    return ResourceView(
        ASG, f"{pool}-asg", {"vpcZoneIdentifiers": list(subnets), "tags": tags}, urn=f"urn:{pool}"
    )


def findings(*resources: ResourceView) -> list[str]:
    filesystem = ResourceView(LUSTRE, "fsx", {"subnetIds": ["a"]}, urn="urn:fsx")
    subnets = [subnet("a", "zone-a"), subnet("b", "zone-b"), subnet("c", "zone-c")]
    index = ResourceIndex([*subnets, filesystem, *resources])
    return [f.message for f in check_filesystem_zone(index, PolicyContext(None))]


def test_subnets_without_a_known_zone_say_nothing_of_a_pools_zones() -> None:
    assert (
        findings(
            subnet("blank", None), subnet("preview", UNKNOWN), training("train", "a", "blank", "preview")
        )
        == []
    )


def test_the_finding_lists_every_training_pools_zones() -> None:
    assert findings(training("train", "a"), training("wide", "b", "c")) == [
        "training pool wide launches in zone-b/zone-c but the file system fsx serves from zone-a: every read "
        "and checkpoint of its jobs crosses zones (latency on each Lustre RPC, inter-zone transfer billed); "
        "the training pools sit in different zones (train in zone-a, wide in zone-b/zone-c) and one file "
        "system serves one zone"
    ]
