"""The distributed training example (examples/train_dist/train.py): which checkpoint it resumes from
(only complete ones: a save interrupted half-way is never picked), and a real two-process run under
torchrun that is stopped by SIGTERM, saves the step it is at, and resumes to the same bit-exact model
as a run that was never interrupted."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_dist" / "train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _module() -> ModuleType:
    return load_script(SCRIPT)


def _fake_checkpoint(root: Path, step: int, *, metadata: bool, marker: str | None) -> Path:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / ".metadata").write_bytes(b"plan")
    if marker is not None:
        (path / "COMPLETE").write_text(marker)
    return path


def test_only_complete_checkpoints_are_resumed_from(tmp_path: Path) -> None:
    train = _module()
    _fake_checkpoint(tmp_path, 20, metadata=True, marker="step=20\n")
    _fake_checkpoint(tmp_path, 40, metadata=True, marker="step=40\n")
    _fake_checkpoint(tmp_path, 60, metadata=False, marker=None)  # shards written, DCP never finished
    _fake_checkpoint(tmp_path, 80, metadata=True, marker=None)  # finished, never marked
    _fake_checkpoint(tmp_path, 100, metadata=True, marker="step=60\n")  # a marker copied from elsewhere
    (tmp_path / "step-00000120").write_text("not a directory")
    assert train.newest_complete(tmp_path) == 40
    assert train.newest_complete(tmp_path / "missing") is None


def test_pruning_keeps_the_newest_complete_and_a_save_in_flight(tmp_path: Path) -> None:
    train = _module()
    for step in (10, 20, 30):
        _fake_checkpoint(tmp_path, step, metadata=True, marker=f"step={step}\n")
    _fake_checkpoint(tmp_path, 15, metadata=False, marker=None)
    _fake_checkpoint(tmp_path, 40, metadata=False, marker=None)
    train.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000020", "step-00000030", "step-00000040"]


def test_every_rank_reads_its_share_of_a_fixed_global_batch() -> None:
    train = _module()
    shares = [train.batch_indices(7, 5, 64, rank, 4) for rank in range(4)]
    whole = sorted(int(i) for share in shares for i in share)
    assert len(whole) == len(set(whole)) == 64
    assert whole == sorted(int(i) for i in train.batch_indices(7, 5, 64, 0, 1))
    assert not train.batch_indices(7, 6, 64, 0, 1).equal(train.batch_indices(7, 5, 64, 0, 1))


def _torchrun(directory: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), "--dir", str(directory)]
    command += ["--steps", "120", "--every", "40", "--log-every", "1", *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=180)
    return process.returncode, output


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed (pip install -e '.[dev]')")
def test_a_sigterm_saves_the_step_and_the_resumed_run_ends_bit_identical(tmp_path: Path) -> None:
    reference = _torchrun(tmp_path / "reference")
    # Slow enough that the SIGTERM, sent once step 45+ is read, lands well before step 120 (loaded machines).
    interrupted = _torchrun(tmp_path / "job", "--step-seconds", "0.15")
    code, output = _finish(reference)
    assert code == 0, output[-3000:]
    expected = re.search(r"^done step=120 .* digest=(\w+)", output, re.MULTILINE)
    assert expected, output[-3000:]

    deadline = time.monotonic() + 120
    log = ""
    assert interrupted.stdout is not None
    while time.monotonic() < deadline:
        line = interrupted.stdout.readline()
        log += line
        if re.match(r"^step (4[5-9]|[5-9]\d) ", line):  # past the first periodic checkpoint (40)
            break
    interrupted.send_signal(signal.SIGTERM)
    code, output = _finish(interrupted)
    output = log + output
    stopped = re.search(r"^SIGTERM: checkpoint at step (\d+)", output, re.MULTILINE)
    assert code != 0 and stopped, output[-3000:]
    step = int(stopped.group(1))
    assert step > 40 and (tmp_path / "job" / f"step-{step:08d}" / "COMPLETE").is_file()

    # A save cut off half-way after that one: never resumed from.
    partial = tmp_path / "job" / f"step-{step + 5:08d}"
    shutil.copytree(tmp_path / "job" / f"step-{step:08d}", partial)
    (partial / "COMPLETE").unlink()

    code, output = _finish(_torchrun(tmp_path / "job"))
    assert code == 0, output[-3000:]
    assert re.search(rf"^start host=\S+ world=2 resumed_from={step} ", output, re.MULTILINE), output[-3000:]
    assert f"digest={expected.group(1)}" in output, output[-3000:]


def test_a_checkpoint_is_complete_only_with_dcps_metadata_and_its_own_marker(tmp_path: Path) -> None:
    """DCP writes .metadata last, after every rank's shards: a marker without it (a save cut off, a marker
    copied in) does not make the checkpoint resumable; nor does a marker naming another step."""
    train = _module()
    for step in (20, 40, 60):
        _fake_checkpoint(tmp_path, step, metadata=True, marker=f"step={step}\n")
    _fake_checkpoint(tmp_path, 80, metadata=False, marker="step=80\n")
    assert train.newest_complete(tmp_path) == 60
    assert not train.is_complete(tmp_path / "step-00000080")
    assert train.is_complete(tmp_path / "step-00000060")
    (tmp_path / "step-00000060" / "COMPLETE").write_text("step=6\n")
    assert train.newest_complete(tmp_path) == 40
    assert train.step_dir(tmp_path, 7) == tmp_path / "step-00000007"


def test_only_step_directories_count_as_checkpoints(tmp_path: Path) -> None:
    train = _module()
    _fake_checkpoint(tmp_path, 10, metadata=True, marker="step=10\n")
    (tmp_path / "step-123").mkdir()  # not eight digits
    (tmp_path / "step-0000001x").mkdir()
    (tmp_path / "step-00000030").write_text("a file")
    assert [step for step, _ in train.checkpoints(tmp_path)] == [10]


def test_pruning_removes_incomplete_saves_older_than_the_newest_complete_one(tmp_path: Path) -> None:
    train = _module()
    for step in (10, 20, 30):
        _fake_checkpoint(tmp_path, step, metadata=True, marker=f"step={step}\n")
    _fake_checkpoint(tmp_path, 25, metadata=False, marker=None)  # between two complete ones: abandoned
    _fake_checkpoint(tmp_path, 40, metadata=False, marker=None)  # newer: a save in flight
    train.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000020", "step-00000030", "step-00000040"]
