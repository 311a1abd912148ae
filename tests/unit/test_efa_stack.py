"""The EFA installer follows the NCCL the nodes load (infra/platform/efa.py): the nodes' libnccl2 and the
training environment's torch wheel's, whose NCCL the jobs run. Its aws-ofi-nccl plugin must support both;
the plan names both NCCLs and the installer, and its plugin's path per installer release reaches the
roles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli.app import app
from infra.data.packages import package_facts
from infra.errors import SpecError
from infra.nodes.inventory import platform_vars
from infra.platform.efa import NcclUse, resolve_efa, supports
from infra.platform.resolve import load_platform

ROOT = Path(__file__).resolve().parents[2]
FACTS = package_facts()


def aws_prod_variant(tmp_path: Path, software: dict[str, Any], training: dict[str, Any]) -> Path:
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.aws-prod.yaml").read_text())
    platform = stack["config"]["gpu-platform:platform"]
    platform["software"] = {**platform.get("software", {}), **software}
    platform["training"] = {**platform.get("training", {}), **training}
    path = tmp_path / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def test_aws_prod_names_the_nccl_jobs_run_and_an_installer_whose_plugin_supports_it() -> None:
    platform = load_platform(ROOT / "stacks" / "Pulumi.aws-prod.yaml")
    sw = platform.software
    assert (sw.nccl, sw.jobs_torch, sw.jobs_nccl) == ("2.28.3", "2.13.0", "2.29.7")
    assert sw.efa is not None
    installer = FACTS.efa_installer.release(sw.efa.installer)
    assert installer is not None and supports(installer, sw.nccl) and supports(installer, sw.jobs_nccl)
    values = platform_vars(platform)
    assert values["rdma_efa_installer_version"] == sw.efa.installer
    assert values["nccl_efa_plugin"] == sw.efa.plugin_path


def test_the_plan_prints_both_nccls_and_the_installer() -> None:
    result = CliRunner().invoke(app, ["plan", "--stack", "aws-prod"])
    assert result.exit_code == 0, result.output
    assert "NCCL jobs run: 2.29.7, from torch 2.13.0's wheel" in result.output
    assert (
        "EFA installer 1.47.0: aws-ofi-nccl 1.18.0 (supports NCCL 2.29: its release names 2.29.2, other "
        "patches of that minor taken as supported)" in result.output
    )


def test_an_installer_whose_plugin_does_not_support_the_nccl_is_refused(tmp_path: Path) -> None:
    """EFA 1.43.1's aws-ofi-nccl 1.16.2 supports NCCL up to 2.27.6: not the nodes' 2.28.3."""
    with pytest.raises(SpecError) as refused:
        load_platform(aws_prod_variant(tmp_path, {"efa_installer": "1.43.1"}, {}))
    message = str(refused.value)
    assert "gpu-platform:platform.software.efa_installer" in message
    assert "aws-ofi-nccl 1.16.2, which supports NCCL up to 2.27.6" in message
    assert (
        "2.28.3 (the nodes' libnccl2" in message and "2.29.7 (training jobs: torch 2.13.0's wheel)" in message
    )


def test_the_jobs_nccl_alone_can_refuse_an_installer(tmp_path: Path) -> None:
    """1.44.0's plugin supports the nodes' 2.28.3 but not torch 2.13's 2.29.7; torch 2.11 (2.28.9) fits it."""
    with pytest.raises(SpecError, match=r"2\.29\.7 \(training jobs: torch 2\.13\.0's wheel\)"):
        load_platform(aws_prod_variant(tmp_path, {"efa_installer": "1.44.0"}, {}))
    platform = load_platform(
        aws_prod_variant(tmp_path, {"efa_installer": "1.44.0"}, {"torch_version": "2.11.0"})
    )
    assert platform.software.efa is not None and platform.software.efa.installer == "1.44.0"


def test_an_installer_pinned_on_a_stack_without_efa_is_refused_not_ignored(tmp_path: Path) -> None:
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.onprem.yaml").read_text())
    platform = stack["config"]["gpu-platform:platform"]
    assert platform.get("fabric", {}).get("kind", "none") != "efa"
    platform["software"] = {**platform.get("software", {}), "efa_installer": "1.47.0"}
    path = tmp_path / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump(stack))
    with pytest.raises(
        SpecError, match=r"software\.efa_installer: an EFA installer is installed on fabric kind efa only"
    ):
        load_platform(path)


def test_unknown_installer_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown EFA installer 1\.99\.0; known: 1\.43\.1"):
        load_platform(aws_prod_variant(tmp_path, {"efa_installer": "1.99.0"}, {}))


@pytest.mark.parametrize(
    ("installer", "os_release", "plugin"),
    [
        ("1.43.3", "ubuntu2204", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so"),
        ("1.44.0", "ubuntu2204", "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"),
        ("1.43.3", "rhel9", "/opt/amazon/ofi-nccl/lib64/libnccl-net.so"),
        ("1.47.0", "rhel9", "/opt/amazon/ofi-nccl/lib64/libnccl-net-ofi.so"),
    ],
)
def test_the_plugin_path_follows_the_installer_release(installer: str, os_release: str, plugin: str) -> None:
    """From 1.44.0 the plugin moved and was renamed (aws/deep-learning-containers scripts/install_efa.sh)."""
    release = FACTS.efa_installer.release(installer)
    assert release is not None
    assert release.plugin_path(FACTS.release(os_release)) == plugin


@pytest.mark.parametrize(
    ("nccl", "supported"),
    [
        ("2.27.7", True),
        ("2.28.1", True),
        ("2.28.3", True),
        ("2.28.9", True),
        ("2.29.0", False),
        ("2.16.5", False),
    ],
)
def test_a_plugin_supports_its_nccl_minor_and_older_down_to_2_17_1(nccl: str, supported: bool) -> None:
    """aws-ofi-nccl 1.17.1 (EFA 1.44.0) 'supports NCCL v2.28.3-1 while maintaining backward compatibility with
    NCCL v2.17.1 and later'."""
    release = FACTS.efa_installer.release("1.44.0")
    assert release is not None
    assert supports(release, nccl) is supported


def test_the_newest_installer_whose_plugin_fits_is_chosen() -> None:
    """NCCL 2.28.3: 1.44.0 to 1.47.0 fit; the newest of them, not the first listed."""
    efa, problems = resolve_efa(
        FACTS.efa_installer, [NcclUse("2.28.3", "the nodes")], None, FACTS.release("ubuntu2204"), "p"
    )
    fitting = [r.version for r in FACTS.efa_installer.releases if supports(r, "2.28.3")]
    assert problems == [] and efa is not None
    assert len(fitting) > 1 and efa.installer == max(fitting, key=lambda v: tuple(map(int, v.split("."))))


def test_with_no_installer_that_fits_the_plan_says_what_would() -> None:
    _, problems = resolve_efa(
        FACTS.efa_installer, [NcclUse("2.30.1", "training jobs")], None, FACTS.release("ubuntu2204"), "p"
    )
    [(path, message)] = problems
    assert path == "p" and "pick an older training.torch_version or software.nccl" in message


def test_a_recorded_sha256_reaches_the_role_and_none_is_needed_for_the_signed_installer() -> None:
    """ParallelCluster pins the installer's sha256 (aws-parallelcluster-cookbook,
    resources/efa/partial/_common.rb efa_checksum); the data records one per release where it was verified.
    Without one the role still runs only an installer AWS's signature verifies
    (tests/roles/test_efa_signature.py), so the plan has nothing to warn about."""
    digest = "ab" * 32
    releases = [r.model_copy(update={"sha256": digest}) for r in FACTS.efa_installer.releases]
    facts = FACTS.efa_installer.model_copy(update={"releases": releases})
    stack, _ = resolve_efa(facts, [NcclUse("2.28.3", "nodes")], None, FACTS.release("ubuntu2204"), "p")
    assert stack is not None and stack.sha256 == digest
    platform = load_platform(ROOT / "stacks" / "Pulumi.aws-prod.yaml")
    assert platform.software.efa is not None and platform.software.efa.sha256 is None
    assert "rdma_efa_installer_checksum" not in platform_vars(platform)
    result = CliRunner().invoke(app, ["plan", "--stack", "aws-prod"])
    assert result.exit_code == 0 and "without a checksum" not in " ".join(result.output.split())
