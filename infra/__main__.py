"""Entry point of `pulumi up` / `pulumi preview` (Pulumi.yaml: main: infra/)."""

from infra.program import build, platform_from_config

build(platform_from_config())
