"""The Makefile's pytest tiers over tests/unit, tests/pulumi and tests/roles: `test-unit` and
`test-processes` split those tests by the `processes` mark with nothing left out and nothing run twice,
`test-fast` runs part of `test-unit`, and `make test` runs both tiers. A test moved out of the unit tier
for its cost is still run by `make test`."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

MAKEFILE = ROOT / "Makefile"
TIERS = ("test-unit", "test-processes", "test-fast")

# The marks pyproject.toml registers (its `[tool.pytest.ini_options] markers`): a tier's `-m` may name any.
REGISTERED = [
    entry.split(":")[0].split("(")[0]
    for entry in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"][
        "ini_options"
    ]["markers"]
]


def marked_tests() -> str:
    """A test module with a plain test, one test for each registered mark, and one for each mark together
    with `processes`: a tier that leaves out any of them (`-m "not processes and not long"`) is seen."""
    tests = ["import pytest", "", "def test_plain():", "    pass"]
    combinations = {tuple(sorted({mark, extra})) for mark in REGISTERED for extra in (mark, "processes")}
    for marks in sorted(combinations):
        tests += ["", *(f"@pytest.mark.{m}" for m in marks), f"def test_{'_and_'.join(marks)}():", "    pass"]
    return "\n".join(tests) + "\n"


def marks_of(test: str) -> set[str]:
    """The marks of a test of marked_tests(), from its name."""
    return set(test.removeprefix("test_").split("_and_")) - {"plain"}


# The words a tier's pytest command may hold besides its `-m` and its paths: any other (`-k`, `--ignore`,
# a second `-m`, `|| true`) changes what runs or whether a failure counts, which this guard cannot judge.
OPTIONS = {"-q", "-n", "auto"}


def recipes(makefile: Path = MAKEFILE) -> dict[str, list[str]]:
    """Each rule's recipe lines (tab-indented, after `target: ...`; a line ending in `\\` joined with
    the next), by target."""
    found: dict[str, list[str]] = {}
    target: str | None = None
    text = re.sub(r"\\\n\s*", " ", makefile.read_text(encoding="utf-8"))
    for line in text.splitlines():
        rule = re.match(r"^([\w.-]+):(?!=)", line)
        if rule:
            target = rule[1]
            found[target] = []
        elif line.startswith("\t") and target is not None:
            found[target].append(line.strip())
        elif line and not line.startswith("#"):
            target = None
    return found


def pytest_arguments(target: str) -> list[str]:
    """The arguments of the pytest a target's recipe runs (the one recipe line that runs $(BIN)/pytest),
    which must be `time $(BIN)/pytest`, options of OPTIONS, one `-m` and the paths last: make's `-` (errors
    ignored) before the line, or anything after the paths, fails here."""
    [command] = [line for line in recipes()[target] if "$(BIN)/pytest" in line]
    words = shlex.split(command)
    assert words[: words.index("$(BIN)/pytest")] == ["time"], command
    arguments = words[words.index("$(BIN)/pytest") + 1 :]
    options = [word for word in arguments if not word.startswith("tests/")]
    paths = arguments[len(options) :]
    unmodelled = [word for word in options if word not in OPTIONS]
    assert not unmodelled or unmodelled == ["-m", unmodelled[-1]], f"{target}: {command}"
    assert paths and all(word.startswith("tests/") for word in paths), f"{target}: {command}"
    return arguments


def selection(arguments: list[str]) -> tuple[str | None, list[str]]:
    """A tier's `-m` expression (None: every test) and the test paths it runs."""
    expression = arguments[arguments.index("-m") + 1] if "-m" in arguments else None
    paths = [word for word in arguments if word.startswith("tests/")]
    return expression, paths


def selected(pytester: pytest.Pytester, expression: str | None) -> set[str]:
    """The tests of MARKED that pytest runs under `-m expression`."""
    pytester.makepyfile(test_marked=marked_tests())
    marks = ["-p", "no:cacheprovider", "-o", "markers=" + "\n".join(REGISTERED)]
    result = pytester.runpytest_inprocess(*marks, *(["-m", expression] if expression else []), "-q")
    return {report.nodeid.split("::")[1] for report in result.reprec.getreports("pytest_runtest_logreport")}


def test_the_unit_and_processes_tiers_split_the_same_tests_with_none_left_out_or_run_twice(
    pytester: pytest.Pytester,
) -> None:
    unit, unit_paths = selection(pytest_arguments("test-unit"))
    processes, processes_paths = selection(pytest_arguments("test-processes"))
    assert unit_paths == processes_paths == ["tests/unit", "tests/pulumi", "tests/roles"]
    every = selected(pytester, None)
    in_unit, in_processes = selected(pytester, unit), selected(pytester, processes)
    assert in_unit | in_processes == every and not in_unit & in_processes, (in_unit, in_processes)
    assert in_processes == {test for test in every if "processes" in marks_of(test)}, in_processes


def test_the_fast_tier_runs_part_of_the_unit_tier_and_no_container(pytester: pytest.Pytester) -> None:
    fast, fast_paths = selection(pytest_arguments("test-fast"))
    unit, unit_paths = selection(pytest_arguments("test-unit"))
    assert fast_paths == unit_paths
    every = selected(pytester, None)
    # the unit tier less the tests that start containers (those marked `containers`, alone or with another)
    in_fast = selected(pytester, fast)
    assert in_fast == {test for test in selected(pytester, unit) if "containers" not in marks_of(test)}
    assert in_fast < every


def test_make_test_runs_both_tiers() -> None:
    [streams] = [line for line in recipes()["test"] if "scripts/test-streams.sh" in line]
    streamed = shlex.split(streams.split("test-streams.sh", 1)[1])
    targets = {target for stream in streamed for target in stream.split()}
    assert {"test-unit", "test-processes"} <= targets, streams
