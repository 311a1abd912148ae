"""Find stack files and read the platform description out of them."""

from __future__ import annotations

import codecs
import difflib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.data.load import catalog
from infra.errors import SpecError
from infra.errors.problems import field_path, spec_error, validation_problems
from infra.spec.catalog_checks import catalog_problems
from infra.spec.models import PATTERN_MEANINGS, PlatformSpec
from infra.spec.overrides import apply_overrides

CONFIG_KEY = "gpu-platform:platform"
PROJECT_ROOT = Path(__file__).resolve().parents[2]

# A stack of 5000 listed hosts (the most a platform has) is about 300 KB; anything far larger is not a
# stack file, and reading it whole would only cost memory.
MAX_FILE_BYTES = 1024 * 1024

# Pulumi's rule for stack names: letters, digits, hyphens, underscores and periods.
_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]+")

_BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


STACKS_DIR_ENV = "GPUPLAT_STACKS_DIR"


def stacks_dir() -> Path:
    """Where --stack NAME and --all look: $GPUPLAT_STACKS_DIR; else the `stacks/` of the current directory
    or the nearest directory above it that has one with stack files (a checkout of the platform, as Pulumi
    finds Pulumi.yaml); else the stacks shipped with gpuplat."""
    override = os.environ.get(STACKS_DIR_ENV)
    if override:
        return Path(override)
    here = Path.cwd()
    for directory in (here, *here.parents):
        candidate = directory / "stacks"
        if candidate.is_dir() and any(candidate.glob("Pulumi.*.yaml")):
            return candidate
    return PROJECT_ROOT / "stacks"


def stack_file(name: str) -> Path:
    if name.endswith((".yaml", ".yml")):
        bare = Path(name).name.removeprefix("Pulumi.").removesuffix(".yaml").removesuffix(".yml")
        raise SpecError(
            f"--stack {name}: --stack takes a stack's name ({bare}, for stacks/Pulumi.{bare}.yaml); for a "
            f"file give --stack-file {name}"
        )
    if not _STACK_NAME.fullmatch(name):
        raise SpecError(
            f"stack name {name!r}: a stack name holds letters, digits, -, _ and . only (e.g. aws-prod); "
            f"known stacks: {', '.join(stack_names()) or 'none'}"
        )
    return stacks_dir() / f"Pulumi.{name}.yaml"


def stack_names() -> list[str]:
    return sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir().glob("Pulumi.*.yaml")
    )


def _read_bytes(path: Path, what: str, not_found: str) -> bytes:
    try:
        if path.exists() and not path.is_file():  # a directory, a device, a pipe
            raise SpecError(f"{path}: not a regular file; give the path of a {what}.")
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: {not_found}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read {what} ({exc.strerror}).") from exc
    except ValueError as exc:  # a path holding a NUL character
        raise SpecError(f"{path!r}: not a usable path ({exc}).") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(
            f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; a {what} is a few KB (even a stack file "
            "listing 5000 hosts, the most a platform has, is about 300 KB)."
        )
    return data


def _decode(path: Path, data: bytes) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is dropped); anything else is named, never guessed at."""
    for mark, encoding in _BYTE_ORDER_MARKS:
        if data.startswith(mark):
            raise SpecError(
                f"{path}: the file is {encoding} text (it starts with a {encoding} byte-order mark); YAML "
                "files here are UTF-8: save it as UTF-8."
            )
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise SpecError(f"{path}: line {line} holds a NUL byte: binary data, not a YAML text file.")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(
            f"{path}: line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 ({exc.reason}); YAML files here "
            "are UTF-8 (Latin-1 or Windows-1252 text is the usual cause): save it as UTF-8."
        ) from None


class _NoRepeatedKeysLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping (YAML readers disagree on which wins)."""


def _mapping_without_repeats(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            first = seen.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:
            continue  # an unhashable key: construct_mapping reports it
        if first != key_node.start_mark.line + 1:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice (first on line {first})", key_node.start_mark
            )
    return loader.construct_mapping(node)


_NoRepeatedKeysLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats
)


def _yaml_error(path: Path, text: str, exc: yaml.YAMLError) -> SpecError:
    """The file, line and column of a YAML error, in place of PyYAML's `<unicode string>`."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = ""
        if exc.context and exc.context_mark is not None:
            context = f" ({exc.context}, which starts on line {exc.context_mark.line + 1})"
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        return SpecError(f"{path}, {where}: not valid YAML: {exc.problem}{context}.")
    if isinstance(exc, yaml.reader.ReaderError):
        line = text[: exc.position].count("\n") + 1
        return SpecError(
            f"{path}, line {line}: not valid YAML: character U+{exc.character:04X} is not allowed in YAML "
            "text."
        )
    return SpecError(f"{path}: not valid YAML: {exc}")


def read_yaml_file(path: Path, what: str, not_found: str | None = None) -> Any:
    """The YAML document of a file, or one SpecError naming the file, line and what is wrong with it."""
    text = _decode(path, _read_bytes(path, what, not_found or f"{what} not found."))
    try:
        return yaml.load(text, Loader=_NoRepeatedKeysLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise _yaml_error(path, text, exc) from None
    except RecursionError:
        raise SpecError(f"{path}: not valid YAML for this tool: nested too deeply.") from None


def read_stack_config(path: Path) -> dict[str, Any]:
    """The `config:` mapping of a Pulumi stack file."""
    known = ", ".join(stack_names()) or "none"
    document = read_yaml_file(
        path,
        "stack file",
        not_found=f"stack file not found. Give --stack NAME for stacks/Pulumi.NAME.yaml (known: {known}) "
        "or --stack-file PATH.",
    )
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise SpecError(
            f"{path}: a stack file is a mapping with a `config:` mapping (Pulumi stack settings)."
        )
    config: dict[str, Any] = document["config"]
    return config


def parse_spec(raw: Any, source: Path | str) -> PlatformSpec:
    """The validated platform description: its fields, then its contradictions with the node catalog."""
    try:
        spec = PlatformSpec.model_validate(raw)
    except ValidationError as exc:
        problems = validation_problems(
            exc,
            lambda loc: field_path(CONFIG_KEY, loc),
            model=PlatformSpec,
            pattern_meanings=PATTERN_MEANINGS,
        )
        raise spec_error(source, _named_pools(problems, raw)) from exc
    found = catalog_problems(spec, catalog())
    if found:
        raise spec_error(source, _named_pools([(field_path(CONFIG_KEY, loc), m) for loc, m in found], raw))
    return spec


_POOL_INDEX = re.compile(rf"^{re.escape(CONFIG_KEY)}\.pools\[(\d+)\]")


def _named_pools(problems: list[tuple[str, str]], raw: Any) -> list[tuple[str, str]]:
    """A problem at pools[i] also names the pool, where the file gives it a name: `(pool train)`."""
    pools = raw.get("pools") if isinstance(raw, dict) else None
    named = []
    for path, message in problems:
        match = _POOL_INDEX.match(path)
        index = int(match.group(1)) if match else -1
        name = None
        if isinstance(pools, list) and 0 <= index < len(pools) and isinstance(pools[index], dict):
            name = pools[index].get("name")
        named.append((path, f"{message} (pool {name})" if isinstance(name, str) and name else message))
    return named


def _check_provider_region(path: Path, config: dict[str, Any], spec: PlatformSpec) -> None:
    """The AWS provider deploys to `aws:region`; the platform plans zones and endpoints in its region."""
    region = config.get("aws:region")
    if spec.backend == "aws" and region is not None and region != spec.region:
        raise spec_error(
            path,
            [
                (
                    "aws:region",
                    f"{region!r} differs from {CONFIG_KEY}.region {spec.region!r}: the AWS provider creates "
                    "every resource in aws:region while the platform plans its zones and endpoints in "
                    "region; give both the same region",
                )
            ],
        )


def load_spec_file(path: Path, overrides: Sequence[str] = ()) -> PlatformSpec:
    """The stack file's platform description, with `--set KEY=VALUE` over it (infra.spec.overrides)."""
    config = read_stack_config(path)
    if CONFIG_KEY not in config:
        close = difflib.get_close_matches(CONFIG_KEY, [str(key) for key in config], n=1)
        hint = f" (is `{close[0]}` meant to be it?)" if close else ""
        raise SpecError(
            f"{path}: no `{CONFIG_KEY}` key under `config:`{hint}; the platform description lives there."
        )
    raw = config[CONFIG_KEY]
    if overrides:
        if not isinstance(raw, dict):
            raise SpecError(f"{path}: `{CONFIG_KEY}` is not a mapping, so --set has nothing to set")
        raw = apply_overrides(raw, overrides)
    source = f"{path} with --set {' '.join(overrides)}" if overrides else path
    spec = parse_spec(raw, source)
    _check_provider_region(path, config, spec)
    return spec
