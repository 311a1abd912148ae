"""Property-based tests of the whole CLI (issue 16), on mutations of the shipped stacks, broken encodings,
odd flag values and policy configs, run in this process through the real entry point.

The rule they hold every command to: a documented exit code (0 ok, 1 policy violation, 2 bad input, 3
missing tool or host setting, 4 failure) and never a traceback; input that is invalid by construction
exits 2, names the file and writes nothing; every run ends in bounded time and memory.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import typer
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.cli.app import app
from infra.errors.problems import allowed_keys, model_at
from infra.policy.rules import RULES
from infra.policy.settings import PolicyConfig
from infra.spec.load import CONFIG_KEY, stack_file, stack_names
from infra.spec.models import PlatformSpec
from tests.conftest import stack_document
from tests.unit.test_hostile_input import CONTRADICTIONS, CliRun, run_cli

SHIPPED = stack_names()
MAX_SECONDS = 10  # one in-process run; a refused file takes milliseconds, a valid inventory well under 1 s
MAX_PEAK_GROWTH_MIB = 256  # what one run may add to the process's peak memory

# Hypothesis keeps no example database (nothing written into the checkout) and has no per-example deadline:
# the machine is shared, so time is bounded by MAX_SECONDS per run instead.
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module", autouse=True)
def nothing_real_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Lifecycle commands only ever get invalid stacks here; were one to pass, it fails loudly (exit 4)
    instead of starting containers. Crash logs go to a temporary state directory. The sweep for event
    loops the Pulumi SDK leaves behind (a full garbage collection, tested in test_policy_cli) is for the
    end of a process, so it is left out of these runs in one process."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a lifecycle command got past an invalid stack")

    state = str(tmp_path_factory.mktemp("state"))
    with (
        mock.patch("infra.cli.commands.lifecycle.bring_up", refuse),
        mock.patch("infra.cli.commands.lifecycle.LocalCluster", refuse),
        mock.patch("infra.cli.app.release_event_loops", lambda: None),
        mock.patch.dict("os.environ", {"XDG_STATE_HOME": state, "GPUPLAT_STATE_DIR": state}),
    ):
        yield


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("property")


_SERIAL = itertools.count()


def _fresh(workdir: Path, name: str) -> Path:
    """A path in the work directory that nothing has written yet (examples share the directory)."""
    return workdir / f"{next(_SERIAL)}-{name}"


def _write_stack(workdir: Path, platform: Any, base: str) -> Path:
    document = copy.deepcopy(stack_document(base))
    document["config"][CONFIG_KEY] = platform
    path = _fresh(workdir, "Pulumi.mutant.yaml")
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _locations(value: Any, loc: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (location, value) inside a platform mapping, containers included."""
    yield loc, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        yield from _locations(child, (*loc, key))


def _replace(platform: dict[str, Any], loc: tuple[Any, ...], value: Any) -> dict[str, Any]:
    mutated = copy.deepcopy(platform)
    target: Any = mutated
    for key in loc[:-1]:
        target = target[key]
    target[loc[-1]] = value
    return mutated


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _holds(run: CliRun, *codes: int) -> None:
    assert run.clean and run.code in codes, (run.code, run.out[-2000:], run.err[-2000:])
    assert run.seconds < MAX_SECONDS and run.peak_growth_mib < MAX_PEAK_GROWTH_MIB, run


def _refused(run: CliRun, path: Path) -> None:
    _holds(run, 2)
    assert run.err.startswith("error:") and str(path) in run.err, run.err


@PROPERTY
@given(data=st.data(), base=st.sampled_from(SHIPPED))
def test_any_value_anywhere_ends_in_0_or_2(workdir: Path, data: st.DataObject, base: str) -> None:
    """A value of any type at any place of a shipped stack: valid (0) or refused (2), nothing half-written."""
    platform = stack_document(base)["config"][CONFIG_KEY]
    loc, _ = data.draw(st.sampled_from([(loc, v) for loc, v in _locations(platform) if loc]), label="where")
    path = _write_stack(workdir, _replace(platform, loc, data.draw(ANY_VALUE, label="value")), base)
    output = _fresh(workdir, "inventory")
    run = run_cli("inventory", "--stack-file", str(path), "--output", str(output))
    _holds(run, 0, 2)
    if run.code == 2:
        assert str(path) in run.err and not output.exists()


def _unknown_key(platform: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    mappings = [loc for loc, value in _locations(platform) if isinstance(value, dict)]
    mappings = [loc for loc in mappings if model_at(PlatformSpec, loc) is not None]
    loc = data.draw(st.sampled_from(mappings), label="mapping")
    model = model_at(PlatformSpec, loc)
    assert model is not None
    key = data.draw(
        st.from_regex(r"[a-z][a-z_-]{0,11}", fullmatch=True).filter(
            lambda k: k not in allowed_keys(model) and k not in model.model_fields
        )
    )
    return _replace(platform, (*loc, key), 1) if loc else {**platform, key: 1}


def _mapping_for_text(platform: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    texts = [loc for loc, value in _locations(platform) if loc and isinstance(value, str)]
    return _replace(platform, data.draw(st.sampled_from(texts), label="text"), {"a": "b"})


def _node_count(platform: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """A node count below 0 or above the most a platform has (on-prem pools get a count beside hosts)."""
    sizes = [loc for loc, _ in _locations(platform) if len(loc) == 3 and loc[2] in ("count", "min", "max")]
    value = data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=5001, max_value=10**40)))
    return _replace(
        platform, data.draw(st.sampled_from(sizes or [("pools", 0, "count")]), label="size"), value
    )


def _contradiction(base: str, data: st.DataObject) -> tuple[str, dict[str, Any]]:
    base, mutate, _ = CONTRADICTIONS[
        data.draw(st.sampled_from(sorted(CONTRADICTIONS)), label="contradiction")
    ]
    platform = copy.deepcopy(stack_document(base)["config"][CONFIG_KEY])
    mutate(platform)
    return base, platform


def _stack_commands(output: Path) -> dict[str, list[str]]:
    """Each command that reads a stack file, with the other options it needs."""
    return {
        "plan": [],
        "check": [],
        "inventory": ["--output", str(output)],
        "manifests": ["--output", str(output)],
        "up": [],
        "down": [],
        "status": [],
        "scale": ["--pool", "train", "--nodes", "1"],
        "validate": [],
        "size": ["--params", "7e9"],
        "ssh": ["head-0", "--print"],
        "logs": ["head-0", "--print"],
    }


def test_every_command_that_reads_a_stack_is_exercised() -> None:
    group: Any = typer.main.get_command(app)
    reading = {
        name
        for name, command in group.commands.items()
        if any("--stack-file" in param.opts for param in command.params)
    }
    assert reading == set(_stack_commands(Path("out")))


def _command(data: st.DataObject, path: Path, output: Path) -> list[str]:
    commands = _stack_commands(output)
    name = data.draw(st.sampled_from(sorted(commands)), label="command")
    return [name, "--stack-file", str(path), *commands[name]]


@PROPERTY
@given(
    data=st.data(),
    base=st.sampled_from(SHIPPED),
    kind=st.sampled_from(["key", "type", "count", "contradiction"]),
)
def test_invalid_stacks_exit_2_from_every_command(
    workdir: Path, data: st.DataObject, base: str, kind: str
) -> None:
    """Unknown keys, wrong types, counts out of range, contradictions: exit 2, the file named, no output."""
    platform = copy.deepcopy(stack_document(base)["config"][CONFIG_KEY])
    if kind == "key":
        platform = _unknown_key(platform, data)
    elif kind == "type":
        platform = _mapping_for_text(platform, data)
    elif kind == "count":
        platform = _node_count(platform, data)
    else:
        base, platform = _contradiction(base, data)
    path = _write_stack(workdir, platform, base)
    output = _fresh(workdir, "out")
    _refused(run_cli(*_command(data, path, output)), path)
    assert not output.exists()


ENCODINGS = st.sampled_from(["utf-16", "utf-16-be", "utf-32", "latin-1", "cp1252"])


@PROPERTY
@given(data=st.data(), base=st.sampled_from(SHIPPED), encoding=ENCODINGS, raw=st.binary(max_size=300))
def test_files_that_are_not_utf8_text_exit_2(
    workdir: Path, data: st.DataObject, base: str, encoding: str, raw: bytes
) -> None:
    """A shipped stack saved in another encoding (with a character UTF-8 would spell differently), or
    bytes that are no text at all: exit 2 naming the file."""
    text = stack_file(base).read_text().replace("platform-team", "équipe-plateforme")
    content = text.encode(encoding) if data.draw(st.booleans(), label="encoded") else raw + b"\x00\xff"
    path = _fresh(workdir, "Pulumi.encoded.yaml")
    path.write_bytes(content)
    output = _fresh(workdir, "out")
    _refused(run_cli(*_command(data, path, output)), path)
    assert not output.exists()


FLAG_TEXT = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "-inf", "1e999", "", "bf16", "fp8", "adamw", "flash", "math", "x"]),
)
SIZE_FLAGS = ["--dp", "--tp", "--pp", "--zero", "--precision", "--optimizer", "--seq-len", "--micro-batch",
              "--hidden", "--layers", "--heads", "--vocab", "--attention", "--gpu-memory"]  # fmt: skip


@PROPERTY
@given(params=FLAG_TEXT, flags=st.dictionaries(st.sampled_from(SIZE_FLAGS), FLAG_TEXT, max_size=5))
def test_size_on_any_flag_values_ends_in_0_or_2(params: str, flags: dict[str, str]) -> None:
    args = ["size", "--params", params, "--json"]
    for flag, value in flags.items():
        args += [flag, value]
    _holds(run_cli(*args), 0, 2)


# Samples of each policy setting, valid and not, for configs whose validity is known by construction.
GOOD_VALUES: dict[str, list[Any]] = {
    "min_spot_share": [0, 0.25, 1],
    "isolate_subnets": [True, False],
    "inference_label": ["workload=inference", "a=b"],
    "required_tags": [["owner"], ["team", "cost-center"], []],
}
BAD_VALUES: dict[str, list[Any]] = {
    "min_spot_share": [-0.1, 2, "half", None, True],
    "isolate_subnets": ["yes", 1, None],
    "inference_label": ["no-equals-sign", 5],
    "required_tags": [["owner", "project"], "owner", [1]],
}
OPTION_OWNER = {option: rule.id for rule in RULES for option in rule.options}


@st.composite
def policy_documents(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A policy config document and whether it is valid."""
    document: dict[str, Any] = {}
    valid = True
    keys = [*sorted(r.id for r in RULES), "all", "no-such-rule"]
    for rule in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        valid &= rule != "no-such-rule"
        entry: dict[str, Any] = {}
        level = draw(st.sampled_from([None, "mandatory", "advisory", "disabled", "strict"]))
        if level is not None:
            entry["enforcementLevel"] = level
            valid &= level != "strict"
        for option in draw(st.lists(st.sampled_from(sorted(GOOD_VALUES)), max_size=2, unique=True)):
            good = draw(st.booleans())
            entry[PolicyConfig.property_name(option)] = draw(
                st.sampled_from(GOOD_VALUES[option] if good else BAD_VALUES[option])
            )
            valid &= good and OPTION_OWNER[option] == rule
        document[rule] = entry
    return document, valid


@PROPERTY
@given(case=policy_documents(), as_json=st.booleans())
def test_policy_configs_are_refused_exactly_when_invalid(
    workdir: Path, case: tuple[dict[str, Any], bool], as_json: bool
) -> None:
    """The config is read before the stack; a stack refused by its unknown key makes every run fast, and
    which file the refusal names tells which one was judged invalid."""
    document, valid = case
    config = _fresh(workdir, "policy.json" if as_json else "policy.yaml")
    config.write_text(json.dumps(document) if as_json else yaml.safe_dump(document))
    platform = {**stack_document("local")["config"][CONFIG_KEY], "colour": "red"}
    stack = _write_stack(workdir, platform, "local")
    run = run_cli("check", "--stack-file", str(stack), "--policy-config", str(config))
    _holds(run, 2)
    named = stack if valid else config
    assert str(named) in run.err, (document, run.err)
