"""The AWS regions a stack may name, and how their zones are named.

Regions: the `Region` enum of pulumi-aws v7.51.1 (sdk/python/pulumi_aws/_enums.py,
https://github.com/pulumi/pulumi-aws/blob/v7.51.1/sdk/python/pulumi_aws/_enums.py), the provider this
project deploys with; tests/unit/test_hostile_input.py keeps the two equal.
Zones: "The code for an Availability Zone is its Region code followed by a letter identifier"
(https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html); a Local
Zone is its parent Region's code, a dash and a location identifier, e.g. us-west-2-lax-1a
(https://docs.aws.amazon.com/local-zones/latest/ug/available-local-zones.html).
"""

from __future__ import annotations

import re

AWS_REGIONS: frozenset[str] = frozenset(
    {
        "af-south-1",
        "ap-east-1",
        "ap-east-2",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-south-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ap-southeast-4",
        "ap-southeast-5",
        "ap-southeast-6",
        "ap-southeast-7",
        "ca-central-1",
        "ca-west-1",
        "cn-north-1",
        "cn-northwest-1",
        "eu-central-1",
        "eu-central-2",
        "eu-isoe-west-1",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "eusc-de-east-1",
        "il-central-1",
        "me-central-1",
        "me-south-1",
        "mx-central-1",
        "sa-east-1",
        "us-east-1",
        "us-east-2",
        "us-gov-east-1",
        "us-gov-west-1",
        "us-iso-east-1",
        "us-iso-west-1",
        "us-isob-east-1",
        "us-isob-west-1",
        "us-isof-east-1",
        "us-isof-south-1",
        "us-west-1",
        "us-west-2",
    }
)

_ZONE_SUFFIX = re.compile(r"[a-z]|-[a-z]+-\d+[a-z]")


def is_zone_of(zone: str, region: str) -> bool:
    """Whether `zone` names an Availability Zone (us-east-1a) or Local Zone (us-east-1-bos-1a) of `region`."""
    return zone.startswith(region) and _ZONE_SUFFIX.fullmatch(zone[len(region) :]) is not None
