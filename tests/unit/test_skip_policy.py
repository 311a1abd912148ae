"""tests/skip_policy.py: under CI=true a skip fails the run unless tests/skip_allowlist.yaml allows its
reason; elsewhere a skip stays a skip."""

from __future__ import annotations

import pytest

from tests.skip_policy import ALLOWLIST, allowed_reasons

TESTS = """
import pytest

def test_runs():
    pass

def test_needs_a_tool():
    pytest.skip("podman is not installed")
"""

GPU_TEST = """
import pytest

def test_needs_a_gpu():
    pytest.skip("no NVIDIA GPU on this machine")
"""

MODULE_SKIP = """
import pytest

pytest.importorskip("a_module_nobody_installed")

def test_never_collected():
    pass
"""


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, **files: str):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makepyfile(**files)
    return pytester.runpytest("-p", "tests.skip_policy", "-p", "no:cacheprovider")


def test_a_skip_the_allowlist_lacks_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", test_tool=TESTS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*skips CI does not allow*", "*test_needs_a_tool: podman is not installed"])


def test_a_skip_at_collection_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", test_module=MODULE_SKIP)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test_module.py*a_module_nobody_installed*"])


def test_an_allowed_reason_passes_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", test_gpu=GPU_TEST)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=1)


def test_outside_ci_a_skip_is_a_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch, None, test_tool=TESTS)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)


def test_a_failing_run_keeps_its_own_exit_code(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", test_tool=TESTS + "\ndef test_fails():\n    assert False\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1, skipped=1)


def test_the_allowlist_is_short_and_says_why() -> None:
    import yaml

    entries = yaml.safe_load(ALLOWLIST.read_text(encoding="utf-8"))
    assert 0 < len(entries) <= 6
    assert all(entry["why"].strip() for entry in entries)
    assert len(allowed_reasons()) == len(entries)
