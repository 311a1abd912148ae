"""The CLI through its real entry point: exit codes, JSON shapes, no tracebacks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from infra.cli.app import main


def cli_env() -> dict[str, str]:
    """A bare environment; crash logs go where the test's crash check looks (tests/conftest.py)."""
    return {"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}


def gpuplat_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`gpuplat ARGS` as a process of its own, as a user's shell starts it."""
    return subprocess.run(
        [sys.executable, "-c", "from infra.cli.app import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(),
        check=False,
    )


def gpuplat(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`gpuplat ARGS` through the same entry point in this process, in the environment `cli_env` gives and
    in `cwd`: what `gpuplat_process` sees, without importing the CLI (pulumi_aws above all, about 4 CPU-s)
    again for every call."""
    out, err = io.StringIO(), io.StringIO()
    saved_environment, saved_cwd, environment = dict(os.environ), os.getcwd(), cli_env()
    code: Any = 0
    try:
        os.environ.clear()
        os.environ.update(environment)
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            main(list(args))
    except SystemExit as exc:
        code = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved_environment)
        os.chdir(saved_cwd)
    returncode = code if isinstance(code, int) else 0 if code is None else 1
    return subprocess.CompletedProcess(["gpuplat", *args], returncode, out.getvalue(), err.getvalue())


def test_size_json_has_the_breakdown() -> None:
    result = gpuplat_process("size", "--params", "7.5e9", "--dp", "64", "--zero", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    per_gpu = data["per_gpu_bytes"]
    assert set(per_gpu) >= {"params", "grads", "optimizer", "model_states", "activations", "total"}
    assert per_gpu["model_states"] == pytest.approx(1.875e9, rel=1e-3)
    assert data["node_plan"]["node_type"]


def test_size_rejects_bad_zero_stage() -> None:
    result = gpuplat("size", "--params", "7e9", "--zero", "5")
    assert result.returncode == 2
    assert "zero" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("stack", ["local", "aws-prod", "onprem"])
def test_plan_json_for_each_stack(stack: str) -> None:
    result = gpuplat("plan", "--stack", stack, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["stack"] == stack
    assert data["budget"]["within"] is True
    assert {p["name"] for p in data["pools"]} >= {"head", "train", "infer"}


def test_plan_is_deterministic() -> None:
    first = gpuplat("plan", "--stack", "aws-prod", "--json").stdout
    assert first == gpuplat("plan", "--stack", "aws-prod", "--json").stdout


def test_unknown_stack_exits_2_without_traceback() -> None:
    result = gpuplat("plan", "--stack", "nope")
    assert result.returncode == 2
    assert "stack file not found" in result.stderr and "Traceback" not in result.stderr


def test_bad_stack_file_exits_2(write_stack: Callable[..., Path]) -> None:
    def negative(platform: dict[str, Any]) -> None:
        platform["pools"][1]["count"] = -1

    path = write_stack("local", negative)
    result = gpuplat("plan", "--stack-file", str(path))
    assert result.returncode == 2
    assert str(path) in result.stderr and "pools[1].count" in result.stderr
    assert "Traceback" not in result.stderr


def test_inventory_to_directory_writes_nothing_on_bad_input(
    write_stack: Callable[..., Path], tmp_path: Path
) -> None:
    def unknown(platform: dict[str, Any]) -> None:
        platform["pools"][1]["instance_type"] = "p9.huge"

    out = tmp_path / "inventory"
    result = gpuplat("inventory", "--stack-file", str(write_stack("local", unknown)), "--output", str(out))
    assert result.returncode == 2
    assert not out.exists()


def test_inventory_to_directory(tmp_path: Path) -> None:
    result = gpuplat("inventory", "--stack", "aws-prod", "--output", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "aws_ec2.yml").exists() and (tmp_path / "group_vars" / "pool_train_spot.yml").exists()


def test_stacks_lists_every_stack() -> None:
    result = gpuplat("stacks", "--json")
    assert result.returncode == 0
    assert {row["stack"] for row in json.loads(result.stdout)} >= {"local", "aws-prod", "onprem"}


def test_usage_error_exits_2() -> None:
    result = gpuplat("plan", "--no-such-flag")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_error_text_with_brackets_is_printed_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.[/odd].yaml"
    result = gpuplat("plan", "--stack-file", str(path))
    assert result.returncode == 2
    assert "[/odd]" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["plan", "--stack", "aws-prod"], ["check", "--stack", "aws-prod"]])
def test_a_reader_that_leaves_early_does_not_change_the_exit_code(command: list[str]) -> None:
    """`gpuplat plan | head -3` under pipefail: the command ends with its own verdict, not a pipe failure.
    The piped run is a process of its own (its stdout a pipe whose reader left); what it must match, the
    command's verdict and message with a reader that stays, is the same entry point run in process."""
    alone = gpuplat(*command)
    program = f"{sys.executable} -c 'from infra.cli.app import main; main()' {' '.join(command)}"
    piped = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {program} | true"],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=False,
    )
    assert piped.returncode == alone.returncode, piped.stderr
    assert piped.stderr == alone.stderr


@pytest.mark.parametrize("command", ["inventory", "manifests"])
def test_output_directories_are_replaced_only_with_force(command: str, tmp_path: Path) -> None:
    """inventory and manifests treat --output alike: a non-empty directory is kept unless --force."""
    stack = {"inventory": "aws-prod", "manifests": "aws-k8s"}[command]
    out = tmp_path / "out"
    assert gpuplat(command, "--stack", stack, "--output", str(out)).returncode == 0
    (out / "mine.txt").write_text("the user's file")
    again = gpuplat(command, "--stack", stack, "--output", str(out))
    assert again.returncode == 2 and "give --force" in again.stderr
    assert (out / "mine.txt").exists()
    forced = gpuplat(command, "--stack", stack, "--output", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (out / "mine.txt").exists()


def test_an_offline_cloud_inventory_names_what_it_leaves_blank(tmp_path: Path) -> None:
    """Offline, an aws inventory lacks the FSx mount source, the controllers' addresses and the SSM bucket:
    it says so (exit 0, the inventory is still useful to read); a static one has nothing blank."""
    cloud = gpuplat("inventory", "--stack", "aws-prod", "--output", str(tmp_path / "aws"))
    assert cloud.returncode == 0, cloud.stderr
    assert "leaves blank" in cloud.stderr
    for blank in ("shared_fs_source", "gpuplat_controller_addresses", "GPUPLAT_SSM_BUCKET"):
        assert blank in cloud.stderr
    onprem = gpuplat("inventory", "--stack", "onprem", "--output", str(tmp_path / "onprem"))
    assert onprem.returncode == 0 and "blank" not in onprem.stderr
