"""`gpuplat plan` warns when the nodes' OS release carries a kernel outside the range the pinned driver is
known to build its DKMS module on (infra/platform/kernels.py, driver_kernels in
infra/data/compatibility.yaml)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from infra.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


def aws_prod_on(tmp_path: Path, os_release: str) -> Path:
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.aws-prod.yaml").read_text())
    stack["config"]["gpu-platform:platform"].setdefault("software", {})["os_release"] = os_release
    path = tmp_path / f"Pulumi.{os_release}.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def test_noble_whose_archive_has_kernel_7_0_is_warned_about(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "--stack-file", str(aws_prod_on(tmp_path, "ubuntu2404"))])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert (
        "Warning: ubuntu2404's archive carries kernel 7.0 (linux-headers-aws 7.0.0-1018.19~24.04.1); driver "
        "580.95.05 is known to build its DKMS module only on kernels below 7.0" in output
    )
    assert "void-linux/void-packages/issues/60171" in output


def test_jammy_within_the_range_has_no_warning(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "--stack-file", str(aws_prod_on(tmp_path, "ubuntu2204"))])
    assert result.exit_code == 0, result.output
    assert "archive carries kernel" not in result.output
