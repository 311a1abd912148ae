"""The suite's own pytest plugins: tests/cpu_report.py (each test's CPU seconds, its child processes'
included), tests/long_first.py (tests marked `long` first) and tests/xdist_workers.py (`-n auto`'s count)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

BUSY_CHILD = """
import subprocess
import sys

def test_quick():
    pass

def test_with_a_busy_child():
    spin = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
"""

ORDER = """
import pytest

def test_first_in_the_file():
    pass

@pytest.mark.long
def test_long():
    pass

def test_last_in_the_file():
    pass
"""


def test_the_cpu_report_charges_a_test_with_the_cpu_of_the_processes_it_ran(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_busy=BUSY_CHILD)
    report = pytester.path / "cpu.jsonl"
    result = pytester.runpytest("-p", "tests.cpu_report", "-p", "no:cacheprovider", f"--cpu-report={report}")
    result.assert_outcomes(passed=2)
    records = [json.loads(line) for line in report.read_text().splitlines()]
    tests = {r["test"]: r for r in records if r["kind"] == "test"}
    busy = tests["test_busy.py::test_with_a_busy_child"]
    assert busy["children"] >= 0.25, busy
    assert tests["test_busy.py::test_quick"]["children"] < 0.1
    assert [r["worker"] for r in records if r["kind"] == "startup"] == ["main"]
    result.stdout.fnmatch_lines(["*CPU seconds per test*", "*tests * (2 tests)*", "*test_with_a_busy_child"])


def test_without_the_option_the_cpu_report_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_busy=BUSY_CHILD)
    result = pytester.runpytest("-p", "tests.cpu_report", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "CPU seconds per test" not in result.stdout.str()
    assert not list(pytester.path.glob("*.jsonl"))


def test_a_test_marked_long_runs_first_and_the_others_keep_their_order(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    long: runs first\n")
    pytester.makepyfile(test_order=ORDER)
    result = pytester.runpytest("-p", "tests.long_first", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["*::test_long PASSED*", "*::test_first_in_the_file PASSED*", "*::test_last_in_the_file PASSED*"]
    )


WHERE_EACH_RAN = """
import os
from pathlib import Path

import pytest

def _ran(name):
    with (Path(__file__).parent / "ran.log").open("a") as log:
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {name}\\n")

@pytest.mark.parametrize("n", range(40))
def test_short(n):
    _ran(f"short{n}")

@pytest.mark.long
@pytest.mark.parametrize("n", range(4))
def test_long(n):
    _ran(f"long{n}")

@pytest.mark.long
@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("n", range(3))
def test_grouped(n):
    _ran(f"grouped{n}")
"""


def test_under_xdist_every_worker_starts_on_its_share_of_the_long_tests(pytester: pytest.Pytester) -> None:
    """xdist's `--dist load` sends each worker a run of consecutive tests first: long tests merely sorted to
    the front all went to the first worker, one after the other. Long tests of one `xdist_group` stay
    together, in one worker. Each test is run once, none is lost."""
    # The workers are processes of their own, started in pytester's directory: its ini puts the checkout
    # on their path (`.venv/bin/pytest` puts no current directory there) and its conftest loads the plugin.
    root = Path(__file__).parents[2]
    pytester.makeini(f"[pytest]\npythonpath = {root}\nmarkers =\n    long: runs first\n")
    pytester.makeconftest('pytest_plugins = ["tests.long_first"]')
    pytester.makepyfile(test_where=WHERE_EACH_RAN)
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=47)
    runs: dict[str, list[str]] = {}
    for line in (pytester.path / "ran.log").read_text().splitlines():
        worker, name = line.split()
        runs.setdefault(worker, []).append(name)
    assert sorted(name for names in runs.values() for name in names) == sorted(
        [f"short{n}" for n in range(40)] + [f"long{n}" for n in range(4)] + [f"grouped{n}" for n in range(3)]
    )
    assert sorted(runs) == ["gw0", "gw1"]
    # Dealt in units, the group of three one of them: long0, long2, long4... to one worker, long1, long3
    # and the group to the other, each worker starting on its own.
    for worker, names in runs.items():
        long = [name for name in names if name.startswith(("long", "grouped"))]
        assert names[: len(long)] == long and len(long) in (2, 5), (worker, names)
    [grouped] = [names for names in runs.values() if "grouped0" in names]
    assert {"grouped0", "grouped1", "grouped2"} <= set(grouped), runs


def test_auto_starts_one_worker_more_than_the_cpus_unless_xdists_setting_says(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/xdist_workers.py, asked through the hook chain `-n auto` asks (so xdist's own answer, one
    worker a CPU, is what this would get without the plugin)."""
    if not request.config.pluginmanager.hasplugin("xdist"):
        pytest.skip("pytest-xdist is not loaded (-p no:xdist): -n auto does not exist")
    ask = request.config.pluginmanager.hook.pytest_xdist_auto_num_workers
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert ask(config=request.config) == len(os.sched_getaffinity(0)) + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert ask(config=request.config) == 5
