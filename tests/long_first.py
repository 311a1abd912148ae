"""A pytest plugin (tests/conftest.py loads it): tests marked `long` (tens of seconds of wall time, most
of it in processes of their own) run first, in their order. xdist hands the first tests out to its
workers in turn, so each worker starts on one and the short tests fill the time after, instead of a long
test started late ending the run while the other worker has nothing left to do."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
