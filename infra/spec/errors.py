"""Turn pydantic validation errors into one paragraph naming file, field path and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infra.errors import SpecError

_MAX_SHOWN = 20


def field_path(root: str, loc: Sequence[int | str]) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _describe(error: Any) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"must be one of {expected}" if expected else message
    received = error.get("input")
    if kind != "missing" and not isinstance(received, dict | list) and received is not None:
        return f"{message} (got {received!r})"
    return message


def spec_error(source: Path | str, problems: Sequence[tuple[str, str]]) -> SpecError:
    """One paragraph: the file, then each problem as `field.path: what is allowed`."""
    lines = [f"  {path}: {message}" for path, message in problems[:_MAX_SHOWN]]
    if len(problems) > _MAX_SHOWN:
        lines.append(f"  ... and {len(problems) - _MAX_SHOWN} more")
    noun = "problem" if len(problems) == 1 else "problems"
    return SpecError(f"{source}: {len(problems)} {noun} in the platform description:\n" + "\n".join(lines))


def spec_error_from_validation(source: Path | str, root: str, exc: ValidationError) -> SpecError:
    problems = []
    for error in exc.errors():
        loc = [part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-"))]
        problems.append((field_path(root, loc), _describe(error)))
    return spec_error(source, problems)
