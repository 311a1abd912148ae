"""A pytest plugin (tests/conftest.py loads it): tests marked `long` (tens of seconds of wall time, most
of it in processes of their own) run first, in their order, so that no long test started late ends the
run while the other worker has nothing left to do.

Under xdist's `--dist load` (what `-n` gives) the first tests are not dealt out one at a time: each worker
gets one run of consecutive tests, `max(2, min(tests // workers // 4, --maxschedchunk))` of them
(pytest-xdist 3.8.0 src/xdist/scheduler/load.py, LoadScheduling.schedule, lines 283-295), and a test once
sent stays with its worker. Long tests merely sorted to the front would all land in the first worker's
run, one after the other; here they are dealt out round robin to the heads of those runs, so every
worker starts on its share of them."""

from __future__ import annotations

from typing import Any

import pytest

_DIST = "long_first_dist"
_MAXSCHEDCHUNK = "long_first_maxschedchunk"


# xdist's hook on the controller (xdist/newhooks.py pytest_configure_node): a worker's own options say
# `--dist no` (xdist/remote.py setup_config sets it), so the controller's distribution travels in
# workerinput, the dictionary xdist hands each worker.
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[_DIST] = node.config.getoption("dist")
    node.workerinput[_MAXSCHEDCHUNK] = node.config.getoption("maxschedchunk")


def _first_runs(config: pytest.Config, tests: int) -> tuple[int, int] | None:
    """(workers, tests in each worker's first run) when an xdist worker of `--dist load` collects; None
    otherwise (no xdist, or another distribution: tests in their sorted order)."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or workerinput.get(_DIST) != "load":
        return None
    workers = int(workerinput["workercount"])
    if tests < 2 * workers:  # xdist then sends one test at a time, round robin: sorted order serves
        return None
    most = workerinput.get(_MAXSCHEDCHUNK) or tests
    return workers, max(2, min(tests // workers // 4, int(most)))


def _units(long: list[pytest.Item]) -> list[list[pytest.Item]]:
    """The long tests as they are dealt: those marked with one `xdist_group` together (xdist's own mark for
    tests that must share a worker; with `--dist load` it keeps them nowhere), so that a module fixture they
    share is set up in one worker, not in each; every other test alone; all in their order."""
    units: list[list[pytest.Item]] = []
    groups: dict[str, list[pytest.Item]] = {}
    for item in long:
        mark = item.get_closest_marker("xdist_group")
        name = (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else None
        if name is None:
            units.append([item])
        elif name in groups:
            groups[name].append(item)
        else:
            groups[name] = [item]
            units.append(groups[name])
    return units


def _dealt(long: list[pytest.Item], short: list[pytest.Item], workers: int, run: int) -> list[pytest.Item]:
    """The order in which xdist's first runs of `run` tests each start with every `workers`-th unit of long
    tests (_units); long tests that do not fit there follow those runs, before the other short tests."""
    units = _units(long)
    heads = [[item for unit in units[worker::workers] for item in unit][:run] for worker in range(workers)]
    placed = {id(item) for head in heads for item in head}
    remaining = iter(short)
    ordered: list[pytest.Item] = []
    for head in heads:
        ordered += head + [item for _, item in zip(range(run - len(head)), remaining, strict=False)]
    return ordered + [item for item in long if id(item) not in placed] + list(remaining)


# trylast: after the deselection by -m and -k (pytest's own hooks), whose result xdist schedules.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long = [item for item in items if item.get_closest_marker("long") is not None]
    short = [item for item in items if item.get_closest_marker("long") is None]
    runs = _first_runs(config, len(items))
    items[:] = long + short if runs is None else _dealt(long, short, *runs)
