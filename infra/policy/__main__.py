"""The CrossGuard policy pack: `pulumi preview --policy-pack infra/policy`.

Constructing PolicyPack starts the policy server and blocks, so this file does nothing else: the rules
live in the infra/policy/rules/ package, their CrossGuard wrappers in infra/policy/pack.py.
"""

from pulumi_policy import EnforcementLevel, PolicyPack

from infra.policy.pack import PACK_NAME, policies

PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=policies(),
    description="gpu-platform: spot usage, training/inference isolation, RDMA fabric, security, budget",
)
