"""`gpuplat plan --base REV` on a real git repository made in the test: the base revision is planned with
that revision's own code (a worktree of it, in a process of its own), so a change to the program shows
with its values; a change to a setting that touches no resource (a team's quota) shows as a setting; the
head's policy verdict is in the comment."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infra.spec.load import CONFIG_KEY, PROJECT_ROOT
from tests.unit.test_cli import gpuplat_process

_CONTROLLER = Path("infra/backends/aws/controller_nodes.py")

pytestmark = [pytest.mark.processes, pytest.mark.long]  # each plans a base revision in a checkout of its own


def _git(repository: Path, *args: str) -> str:
    command = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def platform_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The platform's program and stacks committed in a repository of their own (main)."""
    repository = tmp_path_factory.mktemp("platform")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("infra", "stacks", "roles"):
        shutil.copytree(PROJECT_ROOT / part, repository / part, ignore=ignore)
    _git(repository, "init", "-q", "-b", "main")
    _git(repository, "add", ".")
    _git(repository, "commit", "-q", "-m", "the platform")
    return repository


@pytest.fixture
def branch(platform_repository: Path) -> Iterator[Path]:
    """A branch of main to change; main checked out again afterwards."""
    _git(platform_repository, "checkout", "-q", "-B", "change", "main")
    yield platform_repository
    _git(platform_repository, "checkout", "-q", "-f", "main")


def test_a_code_only_change_shows_with_its_values(branch: Path) -> None:
    controller = branch / _CONTROLLER
    text = controller.read_text()
    assert '"encrypted": True,' in text
    controller.write_text(text.replace('"encrypted": True,', '"encrypted": False,'))
    _git(branch, "commit", "-q", "-am", "controllers: unencrypted root volumes")

    stack = branch / "stacks" / "Pulumi.aws-prod.yaml"
    # The head's code is the repository's too: the process starts in it (`infra` imports from there).
    result = gpuplat_process(
        "plan", "--stack-file", str(stack), "--base", "main", "--format", "json", cwd=branch
    )
    assert result.returncode in (0, 1), result.stderr
    diff = json.loads(result.stdout)
    assert diff["base"] == "main:stacks/Pulumi.aws-prod.yaml" and diff["base_code"] == "the base revision's"
    changed = [c for c in diff["changes"] if c["type"] == "aws:ec2/instance:Instance"]
    assert changed and all(c["op"] == "change" for c in changed)
    # Only those: the role bundle's files (assets, by a path that differs between the two checkouts) are
    # the same content, so no change.
    assert changed == diff["changes"], [(c["type"], c["name"]) for c in diff["changes"] if c not in changed]
    values = {v["field"]: (v["old"], v["new"]) for v in changed[0]["values"]}
    assert values == {"rootBlockDevice.encrypted": (True, False)}
    assert diff["settings"] == []
    # The same change as markdown, with its policy verdict: the comment script's test plans it so.


def test_a_quota_cut_shows_as_a_setting_and_the_verdict_is_in_the_comment(branch: Path) -> None:
    stack = branch / "stacks" / "Pulumi.onprem.yaml"
    document = yaml.safe_load(stack.read_text())
    team = document["config"][CONFIG_KEY]["scheduler"]["teams"][0]
    before = team["gpu_quota"]
    team["gpu_quota"] = 8
    document["config"][CONFIG_KEY]["budget"]["max_gpus"] = 8  # a mandatory rule broken
    stack.write_text(yaml.safe_dump(document, sort_keys=False))
    _git(branch, "commit", "-q", "-am", "a smaller quota and budget")

    result = gpuplat_process(
        "plan", "--stack-file", str(stack), "--base", "main", "--format", "markdown", cwd=branch
    )
    assert result.returncode == 1, result.stderr  # the verdict is the exit code, the comment is written
    text = result.stdout
    assert f"| `scheduler.teams[{team['name']}].gpu_quota` | `{before}` | `8` |" in text
    assert "**Policy: FAILED**" in text and "| mandatory | `budget-gpus` |" in text
    assert "No resource changes." in text or "| change |" in text


def test_the_comment_script_plans_every_stack_on_a_code_change(branch: Path, tmp_path: Path) -> None:
    """scripts/ci/plan-comment.sh: a change to the program alone (no stack file touched) is planned for
    every stack, each planned by the base's code and the head's (PYTHONPATH: the repository's own)."""
    controller = branch / _CONTROLLER
    controller.write_text(controller.read_text().replace('"encrypted": True,', '"encrypted": False,'))
    _git(branch, "commit", "-q", "-am", "controllers: unencrypted root volumes")
    command = (
        tmp_path / "gpuplat"
    )  # the CLI of the repository's own code, as CI installs it from the checkout
    command.write_text(f'#!/bin/sh\nexec {sys.executable} -c "from infra.cli.app import main; main()" "$@"\n')
    command.chmod(0o755)
    environment = {
        "PATH": "/usr/bin:/bin",
        "GPUPLAT": str(command),
        "PYTHONPATH": str(branch),
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(PROJECT_ROOT / "scripts" / "ci" / "plan-comment.sh"), "main", "comment.md"],
        cwd=branch, capture_output=True, text=True, env=environment, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    comment = (branch / "comment.md").read_text()
    names = sorted(p.name.split(".")[1] for p in (branch / "stacks").glob("Pulumi.*.yaml"))
    planned = [line.split("`")[1] for line in comment.splitlines() if line.startswith("### gpuplat plan")]
    assert sorted(planned) == names
    # aws-prod's part as test_a_code_only_change_shows_with_its_values reads its JSON: the values, and the
    # mandatory rule the unencrypted volumes break (plan's exit 1, which the script takes as a verdict).
    parts = comment.split("### gpuplat plan: stack ")[1:]
    [aws_prod] = [part for part in parts if part.startswith("`aws-prod`")]
    assert "rootBlockDevice.encrypted: `true` → `false`" in aws_prod
    assert "**Policy: FAILED**" in aws_prod and "| mandatory | `security-ebs-encrypted` |" in aws_prod
