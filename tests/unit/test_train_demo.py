"""The demo job's checkpointing: atomic, resumable, and interruption leaves the result unchanged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_demo" / "train.py"


def _module() -> ModuleType:
    return load_script(SCRIPT)


def test_uninterrupted_and_resumed_runs_agree(tmp_path: Path) -> None:
    demo = _module()
    assert demo.main(["--dir", str(tmp_path / "a"), "--steps", "120", "--every", "10"]) == 0
    reference = json.loads((tmp_path / "a" / "result.json").read_text())

    interrupted = tmp_path / "b"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dir", str(interrupted), "--steps", "120", "--every", "10",
         "--step-seconds", "0.01"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not list(interrupted.glob("ckpt-*.json")) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.15)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    resumed_at = demo.load_latest(interrupted)["step"]
    assert 0 < resumed_at < 120
    assert demo.main(["--dir", str(interrupted), "--steps", "120", "--every", "10"]) == 0
    result = json.loads((interrupted / "result.json").read_text())
    assert result["resumed_from"] == resumed_at
    assert (result["w"], result["b"], result["loss"]) == (reference["w"], reference["b"], reference["loss"])


def test_keeps_last_k_and_skips_damaged(tmp_path: Path) -> None:
    demo = _module()
    assert demo.main(["--dir", str(tmp_path), "--steps", "50", "--every", "10", "--keep", "2"]) == 0
    names = sorted(p.name for p in tmp_path.glob("ckpt-*.json"))
    assert names == ["ckpt-00000040.json", "ckpt-00000050.json"]
    (tmp_path / "ckpt-00000050.json").write_text('{"state": {"step": 50}, "sha256": "bad"}')
    assert demo.load_latest(tmp_path)["step"] == 40
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_sigterm_checkpoints_at_once_and_waits_to_be_stopped(tmp_path: Path) -> None:
    """Preemption: SIGTERM -> checkpoint at the current step (not the next --every), then wait for SIGKILL."""
    demo = _module()
    assert demo.main(["--dir", str(tmp_path / "ref"), "--steps", "200", "--every", "1000"]) == 0
    reference = json.loads((tmp_path / "ref" / "result.json").read_text())

    work = tmp_path / "preempted"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dir", str(work), "--steps", "200", "--every", "1000",
         "--step-seconds", "0.02", "--progress", "--term-wait", "30"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step 5"):
                os.kill(process.pid, signal.SIGTERM)
            if line.startswith("SIGTERM:"):
                break
        assert lines and lines[-1].startswith("SIGTERM: checkpoint at step "), lines[-3:]
        step = int(lines[-1].split("step ")[1].split(";")[0])
        assert 0 < step < 200
        assert demo.load_latest(work)["step"] == step  # no --every checkpoint was due: this one is new
        time.sleep(0.5)
        assert process.poll() is None, "the job must wait for Slurm to stop it after checkpointing"
    finally:
        process.kill()
        process.wait()
    assert demo.main(["--dir", str(work), "--steps", "200", "--every", "1000"]) == 0
    result = json.loads((work / "result.json").read_text())
    assert result["resumed_from"] == step
    assert (result["w"], result["b"], result["loss"]) == (reference["w"], reference["b"], reference["loss"])


def test_sigterm_wait_is_bounded(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dir", str(tmp_path), "--steps", "100000", "--every", "1000",
         "--step-seconds", "0.01", "--progress", "--term-wait", "0.2"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step 3"):
            os.kill(process.pid, signal.SIGTERM)
            break
    assert process.wait(timeout=20) == 128 + signal.SIGTERM
