"""Find stack files and read the platform description out of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.errors import SpecError
from infra.spec.errors import spec_error_from_validation
from infra.spec.models import PlatformSpec

CONFIG_KEY = "gpu-platform:platform"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def stacks_dir() -> Path:
    override = os.environ.get("GPUPLAT_STACKS_DIR")
    return Path(override) if override else PROJECT_ROOT / "stacks"


def stack_file(name: str) -> Path:
    return stacks_dir() / f"Pulumi.{name}.yaml"


def stack_names() -> list[str]:
    return sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir().glob("Pulumi.*.yaml")
    )


def read_stack_config(path: Path) -> dict[str, Any]:
    """The `config:` mapping of a Pulumi stack file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        known = ", ".join(stack_names()) or "none"
        raise SpecError(
            f"{path}: stack file not found. Give --stack NAME for stacks/Pulumi.NAME.yaml (known: {known}) "
            "or --stack-file PATH."
        ) from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read stack file ({exc.strerror}).") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise SpecError(
            f"{path}: a stack file is a mapping with a `config:` mapping (Pulumi stack settings)."
        )
    config: dict[str, Any] = document["config"]
    return config


def parse_spec(raw: Any, source: Path | str) -> PlatformSpec:
    try:
        return PlatformSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error_from_validation(source, CONFIG_KEY, exc) from exc


def load_spec_file(path: Path) -> PlatformSpec:
    config = read_stack_config(path)
    if CONFIG_KEY not in config:
        raise SpecError(
            f"{path}: no `{CONFIG_KEY}` key under `config:`; the platform description lives there."
        )
    return parse_spec(config[CONFIG_KEY], path)
