"""Policy settings: thresholds and switches, with defaults; the same file format as Pulumi's.

`pulumi preview --policy-pack infra/policy --policy-pack-config FILE` and `gpuplat check
--policy-config FILE` read one JSON (or YAML) document: per rule id, an `enforcementLevel`
(advisory | mandatory | disabled) and the rule's own properties; `"all"` sets every rule's level and
nothing else. As in CrossGuard, a rule sees only the properties given under its own id (Pulumi's
`applyConfig` in pkg/resource/analyzer/config.go hands each policy its own entry; under "all" it applies
only the enforcement level). `gpuplat check` is stricter than Pulumi, which ignores what a policy's schema
does not name: a property a rule does not take is an error naming the rule and the properties it takes.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infra.errors import SpecError
from infra.errors.problems import Loc, Problem, spec_error, validation_problems
from infra.policy.rules import RULES
from infra.policy.settings import ALL_RULES, ENFORCEMENT_KEY, ENFORCEMENT_LEVELS, PolicyConfig
from infra.spec.load import read_yaml_file

_LEVELS = ", ".join(ENFORCEMENT_LEVELS)


def _level_and_settings(key: str, value: Any, problems: list[Problem]) -> tuple[Any, dict[str, Any]]:
    """A rule's entry: a level, or a mapping of an optional level and properties."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, Mapping):
        settings = {str(k): v for k, v in value.items()}
        return settings.pop(ENFORCEMENT_KEY, None), settings
    problems.append((key, f"give an enforcement level ({_LEVELS}) or a mapping of settings"))
    return None, {}


def unknown_properties(rule_id: str, given: dict[str, Any], taken: list[str]) -> list[Problem]:
    problems = []
    for name in sorted(set(given) - set(taken)):
        if rule_id == ALL_RULES:
            message = (
                f"{ALL_RULES} sets only the {ENFORCEMENT_KEY} of every rule; give {name!r} under its rule"
            )
        else:
            close = difflib.get_close_matches(name, taken, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            takes = ", ".join([*taken, ENFORCEMENT_KEY]) if taken else f"only {ENFORCEMENT_KEY}"
            message = f"rule {rule_id} has no property {name!r}{hint}; it takes {takes}"
        problems.append((f"{rule_id}.{name}", message))
    return problems


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


def parse_policy_config(document: Mapping[str, Any], source: str = "policy config") -> PolicyConfig:
    """Check a Pulumi-style policy config document rule by rule and merge it into one PolicyConfig.

    Merging is safe because each property belongs to one rule (a rule's `options`; the registry test
    keeps them apart) and is only accepted under that rule."""

    rules = {rule.id: rule for rule in RULES}
    problems: list[Problem] = []
    properties: dict[str, Any] = {}
    levels: dict[str, Any] = {}
    for raw_key, value in document.items():
        key = str(raw_key)
        if key != ALL_RULES and key not in rules:
            close = difflib.get_close_matches(key, list(rules), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append((key, f"unknown rule {key!r}{hint}; known rules: {', '.join(sorted(rules))}"))
            continue
        level, settings = _level_and_settings(key, value, problems)
        if level is not None:
            levels[key] = level
        taken = [] if key == ALL_RULES else [PolicyConfig.property_name(o) for o in rules[key].options]
        unknown = unknown_properties(key, settings, taken)
        problems += unknown
        if unknown:
            continue
        try:
            PolicyConfig.model_validate(settings)
        except ValidationError as exc:
            problems += [(f"{key}.{path}", message) for path, message in validation_problems(exc, _dotted)]
            continue
        properties.update(settings)
    for key, level in levels.items():
        if level not in ENFORCEMENT_LEVELS:
            problems.append((f"{key}.{ENFORCEMENT_KEY}", f"must be one of {_LEVELS} (got {level!r})"))
    if problems:
        raise spec_error(source, problems, "the policy config")
    every = {rule_id: levels[ALL_RULES] for rule_id in rules} if ALL_RULES in levels else {}
    enforcement = {**every, **{k: v for k, v in levels.items() if k != ALL_RULES}}
    return PolicyConfig.model_validate({**properties, "enforcement": enforcement})


def load_policy_config(path: Path) -> PolicyConfig:
    """A policy config file: JSON where it is one (`.json`, or text that opens with `{`; the format
    `pulumi preview --policy-pack-config` takes), else YAML; each reported in its own terms."""
    document = _read_json(path) if _is_json(path) else read_yaml_file(path, "policy config file")
    if document is None:
        return PolicyConfig()
    if not isinstance(document, Mapping):
        raise SpecError(f"{path}: a policy config is a mapping of rule id to settings.")
    return parse_policy_config(document, str(path))


def _is_json(path: Path) -> bool:
    if path.suffix.lower() == ".json":
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(4096).lstrip().startswith(b"{")
    except OSError:
        return False  # the YAML reader reports it


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the policy config file ({exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{path}, line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}."
        ) from None
