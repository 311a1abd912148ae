from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.resolve import ResolvedPlatform, load_platform
from infra.spec.load import CONFIG_KEY, stack_file

FIXTURES = Path(__file__).parent / "fixtures"


def stack_document(name: str) -> dict[str, Any]:
    return yaml.safe_load(stack_file(name).read_text())


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[..., Path]:
    """Write a variant of a shipped stack: `mutate` edits the platform mapping in place."""

    def write(base: str, mutate: Callable[[dict[str, Any]], None], name: str = "variant") -> Path:
        document = copy.deepcopy(stack_document(base))
        mutate(document["config"][CONFIG_KEY])
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    return write


@pytest.fixture(scope="session")
def shipped_platforms() -> dict[str, ResolvedPlatform]:
    return {name: load_platform(stack_file(name)) for name in ("local", "aws-prod", "onprem")}
