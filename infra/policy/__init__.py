"""The platform's policies: rules as plain functions over a neutral view of resources.

`rules` holds the rules, `view` the neutral resource view, `config` the policy settings, `check` the
offline evaluation `gpuplat check` and `gpuplat plan` use, and `pack` the CrossGuard wrappers. Only
`__main__` constructs the `PolicyPack` (which starts a policy server and blocks).
"""
