"""A pytest plugin (tests/conftest.py loads it): `-n auto` starts one xdist worker more than this process
may run on CPUs at once.

Some tests wait with no CPU of their own: a release lock's lease counted on the real clock (the lock
scripts write whole seconds, so those tests wait out leases of 3 and 6 s), a token's TTL, a command's
timeout. While a worker waits, its core idles unless another worker has a test to run there: with one
worker per core, the unit tier of 2026-12-07 left some 150 of the 426 core-seconds of its 213 s on an
idle 2-core machine unused. One worker more costs its start (about 5 CPU-seconds of imports and
collection).

xdist asks this hook for the count when `-n auto` is given (pytest-xdist 3.8.0 src/xdist/newhooks.py,
pytest_xdist_auto_num_workers; the first answer wins, and a conftest's is asked before xdist's own in
src/xdist/plugin.py). PYTEST_XDIST_AUTO_NUM_WORKERS, xdist's own setting, still chooses the count."""

from __future__ import annotations

import os

import pytest


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as xdist counts them without psutil)."""
    return len(os.sched_getaffinity(0))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return usable_cpus() + 1
