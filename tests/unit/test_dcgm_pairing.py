"""The DCGM exporter follows the DCGM the plan resolves (the release NVIDIA pairs with it, its image tag
<dcgm>-<exporter>), and reads the node's nv-hostengine instead of embedding one of its own."""

from __future__ import annotations

from pathlib import Path

from infra.data.load import compatibility
from infra.data.packages import package_facts, upstream_version
from infra.nodes.inventory import platform_vars
from infra.nodes.role_templates import render_role_template
from infra.platform.resolve import load_platform

ROOT = Path(__file__).resolve().parents[2]


def test_dcgm_4_4_1_gets_its_exporter_not_the_4_2_3_one() -> None:
    platform = load_platform(ROOT / "stacks" / "Pulumi.aws-prod.yaml")
    assert (platform.software.dcgm_version, platform.software.dcgm_exporter_version) == ("4.4.1", "4.6.0")
    values = platform_vars(platform)
    assert (values["dcgm_version"], values["dcgm_exporter_version"]) == ("4.4.1", "4.6.0")


def test_every_paired_exporter_is_a_listed_package_version() -> None:
    [exporter] = [p for p in package_facts().packages if p.name == "datacenter-gpu-manager-exporter"]
    listed = {upstream_version(v) for v in exporter.versions}
    assert {d.exporter for d in compatibility().dcgm} <= listed


def test_the_exporter_reads_the_nodes_host_engine() -> None:
    dropin = render_role_template("dcgm", "exporter-dropin.conf.j2", {})
    [start] = [line for line in dropin.splitlines() if line.startswith("ExecStart=/")]
    assert start.endswith("--remote-hostengine-info localhost:5555")
