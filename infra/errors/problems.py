"""Turn validation problems into one paragraph naming the file, each field by its path in the file, and what
is allowed there."""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from infra.errors import SpecError

_MAX_SHOWN = 20
_MAX_QUOTED = 80

Loc = tuple[int | str, ...]
FieldProblem = tuple[Loc, str]
"""A problem at a location relative to some model (a FieldProblems entry)."""
Problem = tuple[str, str]
"""A problem at a rendered path (a line of a SpecError)."""


class FieldProblems(ValueError):
    """Raised by a model validator to report each problem at the field that is wrong: `loc` is relative to
    the model whose validator raises it (pydantic places the error at that model)."""

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        super().__init__("; ".join(message for _, message in problems))
        self.problems = list(problems)


def field_path(root: str, loc: Sequence[int | str]) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _unwrap(annotation: Any) -> Any:
    """The model or container type behind Optional[...] and Annotated[...]."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            annotation = members[0] if len(members) == 1 else Any
        else:
            return annotation


def _field_annotation(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.annotation
    return None


def model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class a location inside `model` points to, or None where it is not a model."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            current = _field_annotation(current, part)
        elif get_origin(current) in (list, tuple) and isinstance(part, int):
            current = get_args(current)[0]
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def allowed_keys(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _unknown_key(key: int | str, model: type[BaseModel] | None) -> str:
    if model is None:
        return "unknown key"
    keys = allowed_keys(model)
    close = difflib.get_close_matches(str(key), keys, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key{hint}; allowed: {', '.join(keys)}"


def _shown(value: Any) -> str:
    """A value as the message quotes it, cut short: a hostile file may hold megabytes in one field."""
    text = repr(value)
    return text if len(text) <= _MAX_QUOTED else f"{text[:_MAX_QUOTED]}... ({len(text)} characters)"


def _type_name(value: Any) -> str:
    names = {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "true/false",
        type(None): "empty (null)",
    }
    return names.get(type(value), type(value).__name__)


def _describe(error: Any, model: type[BaseModel] | None, pattern_meanings: Mapping[str, str]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    kind = error["type"]
    received = error.get("input")
    context = error.get("ctx", {})
    if kind == "extra_forbidden":
        loc = error["loc"]
        return _unknown_key(loc[-1], model_at(model, loc[:-1]) if model else None)
    if kind == "literal_error":
        expected = context.get("expected", "")
        return f"must be one of {expected} (got {_shown(received)})" if expected else message
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of keys to values, not {_type_name(received)}"
    if kind == "string_pattern_mismatch" and context.get("pattern") in pattern_meanings:
        message = f"must be {pattern_meanings[context['pattern']]}"
    if kind == "string_type" and isinstance(received, bool):
        return "must be text, not true/false: YAML reads yes/no/on/off as true/false, so put it in quotes"
    if kind == "string_type" and isinstance(received, int | float):
        return f'must be text, not the number {_shown(received)}: put it in quotes (e.g. "1.30")'
    if kind != "missing" and not isinstance(received, dict | list | BaseModel) and received is not None:
        return f"{message} (got {_shown(received)})"
    return message


def validation_problems(
    exc: ValidationError,
    path_of: Callable[[Loc], str],
    *,
    model: type[BaseModel] | None = None,
    pattern_meanings: Mapping[str, str] | None = None,
) -> list[Problem]:
    """One (path, message) per error; FieldProblems are placed at their own fields. A misspelt key is one
    problem: the key it was meant to be is not reported missing beside it."""
    problems: list[Problem] = []
    errors = exc.errors()
    meant = _misspelt(errors, model)
    for error in errors:
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if error["type"] == "missing" and loc in meant:
            continue
        raised = error.get("ctx", {}).get("error")
        if isinstance(raised, FieldProblems):
            problems += [(path_of(loc + relative), message) for relative, message in raised.problems]
        else:
            problems.append((path_of(loc), _describe(error, model, pattern_meanings or {})))
    return problems


def _misspelt(errors: Sequence[Any], model: type[BaseModel] | None) -> set[tuple[int | str, ...]]:
    """The locations of required keys that an unknown key beside them was evidently meant to be."""
    if model is None:
        return set()
    meant = set()
    for error in errors:
        if error["type"] != "extra_forbidden":
            continue
        loc = tuple(error["loc"])
        owner = model_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed_keys(owner), n=1) if owner else []
        if close:
            meant.add((*loc[:-1], close[0]))
    return meant


def _line(path: str, message: str) -> str:
    """`path: message`; a message that opens with its own field's dotted path continues the path instead."""
    if not path:  # a problem of several fields together, named in the message
        return f"  {message}"
    subject = message.split(" ", 1)[0]
    if " " in message and "." in subject and path.endswith(f".{subject}"):
        return f"  {path} {message.split(' ', 1)[1]}"
    return f"  {path}: {message}"


def spec_error(
    source: Path | str, problems: Sequence[Problem], what: str = "the platform description"
) -> SpecError:
    """One paragraph: the file, then each problem as `field.path: what is allowed`."""
    lines = [_line(path, message) for path, message in problems[:_MAX_SHOWN]]
    if len(problems) > _MAX_SHOWN:
        lines.append(f"  ... and {len(problems) - _MAX_SHOWN} more")
    noun = "problem" if len(problems) == 1 else "problems"
    return SpecError(f"{source}: {len(problems)} {noun} in {what}:\n" + "\n".join(lines))


def spec_error_from_validation(
    source: Path | str,
    root: str,
    exc: ValidationError,
    *,
    model: type[BaseModel] | None = None,
    pattern_meanings: Mapping[str, str] | None = None,
    what: str = "the platform description",
) -> SpecError:
    problems = validation_problems(
        exc, lambda loc: field_path(root, loc), model=model, pattern_meanings=pattern_meanings
    )
    return spec_error(source, problems, what)
