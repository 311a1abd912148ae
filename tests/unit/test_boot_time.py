"""The plan refuses a ResumeTimeout the pools' nodes cannot boot within (infra/platform/boot_time.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.data.load import boot_times
from infra.errors import SpecError
from infra.nodes.inventory import platform_vars
from infra.platform.resolve import load_platform

ROOT = Path(__file__).resolve().parents[2]


def aws_prod_variant(tmp_path: Path, scheduler: dict[str, Any], aws: dict[str, Any]) -> Path:
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.aws-prod.yaml").read_text())
    platform = stack["config"]["gpu-platform:platform"]
    platform["scheduler"] = {**platform["scheduler"], **scheduler}
    platform["aws"] = {**platform.get("aws", {}), **aws}
    path = tmp_path / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def test_a_plain_image_boot_longer_than_resume_timeout_is_refused(tmp_path: Path) -> None:
    plain = boot_times().seconds("plain")
    path = aws_prod_variant(tmp_path, {"resume_timeout_s": plain - 60}, {"bake_images": False})
    with pytest.raises(SpecError) as refused:
        load_platform(path)
    message = str(refused.value)
    assert "gpu-platform:platform.scheduler.resume_timeout_s" in message
    assert f"about {plain} s from a plain image" in message and "aws.bake_images: true" in message


def test_baked_images_fit_a_short_resume_timeout(tmp_path: Path) -> None:
    baked = boot_times().seconds("baked")
    platform = load_platform(
        aws_prod_variant(tmp_path, {"resume_timeout_s": baked + 60}, {"bake_images": True})
    )
    assert platform_vars(platform)["slurm_common_resume_timeout"] == baked + 60
    with pytest.raises(SpecError, match="from a baked image"):
        load_platform(aws_prod_variant(tmp_path, {"resume_timeout_s": baked - 60}, {}))


def test_every_shipped_stack_fits_its_resume_timeout(shipped_platforms: dict[str, Any]) -> None:
    for platform in shipped_platforms.values():
        if platform.spec.scheduler.kind == "slurm":
            assert (
                platform_vars(platform)["slurm_common_resume_timeout"]
                == platform.spec.scheduler.resume_timeout_s
            )
