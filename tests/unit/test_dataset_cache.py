"""gpuplat-dataset (roles/slurm_compute/files/gpuplat_dataset_cache.py), the node's dataset cache, run
as the program jobs run: a version is copied once and reused by the next job; a corrupted, truncated or
half-staged copy is found and staged again, never handed out; unknown names are refused."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from infra.platform.resolve import load_platform
from infra.spec.load import stack_file
from infra.training.job_env import dataset_sources
from tests.conftest import load_script

PROGRAM = (
    Path(__file__).resolve().parents[2] / "roles" / "slurm_compute" / "files" / "gpuplat_dataset_cache.py"
)


def _setup(tmp_path: Path) -> Path:
    source = tmp_path / "shared" / "datasets" / "corpus" / "v1"
    (source / "shards").mkdir(parents=True)
    (source / "shards" / "000.bin").write_bytes(bytes(range(256)) * 64)
    (source / "shards" / "001.bin").write_bytes(b"second shard" * 100)
    (source / "index.json").write_text('{"shards": 2}')
    config = tmp_path / "datasets.json"
    datasets = [{"name": "corpus", "version": "v1", "source": str(source)}]
    config.write_text(json.dumps({"cache_path": str(tmp_path / "cache"), "datasets": datasets}))
    return config


def _run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_version_is_staged_once_and_the_next_job_reuses_it(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    first = _run(config, "stage", "corpus")
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    assert path == tmp_path / "cache" / "corpus" / "v1"
    assert "staged from" in first.stderr
    assert (path / "shards" / "000.bin").read_bytes() == bytes(range(256)) * 64
    inode = (path / "shards" / "000.bin").stat().st_ino
    second = _run(config, "stage", "corpus")
    assert second.returncode == 0 and Path(second.stdout.strip()) == path
    assert "cached at" in second.stderr and "staged from" not in second.stderr
    assert (path / "shards" / "000.bin").stat().st_ino == inode  # not copied again
    assert _run(config, "verify", "corpus").returncode == 0
    assert "corpus\tv1\tcached" in _run(config, "list").stdout


def test_a_corrupted_copy_is_found_and_staged_again(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    path = Path(_run(config, "stage", "corpus").stdout.strip())
    shard = path / "shards" / "001.bin"
    shard.write_bytes(b"SECOND SHARD" * 100)  # same size, other bytes
    verified = _run(config, "verify", "corpus")
    assert verified.returncode == 1 and "001.bin: content differs" in verified.stdout
    assert _run(config, "verify", "corpus", "--check", "size").returncode == 0  # sizes alone miss it
    again = _run(config, "stage", "corpus")
    assert again.returncode == 0 and "cached copy unusable" in again.stderr and "staged from" in again.stderr
    assert shard.read_bytes() == b"second shard" * 100


def test_a_truncated_or_half_staged_copy_is_never_handed_out(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    path = Path(_run(config, "stage", "corpus").stdout.strip())
    (path / "index.json").write_text("{")
    assert "index.json: 1 bytes, expected 13" in _run(config, "verify", "corpus", "--check", "size").stdout
    (path / "MANIFEST.json").unlink()  # as a copy cut off before its manifest
    leftover = tmp_path / "cache" / "corpus" / ".staging-v1-999"
    leftover.mkdir()
    staged = _run(config, "stage", "corpus")
    assert staged.returncode == 0 and "no complete manifest" in staged.stderr
    assert (path / "index.json").read_text() == '{"shards": 2}' and not leftover.exists()


def test_unknown_datasets_and_missing_sources_are_refused(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    unknown = _run(config, "stage", "imagenet")
    assert (
        unknown.returncode == 2 and "no dataset 'imagenet'" in unknown.stderr and "corpus" in unknown.stderr
    )
    for path in (tmp_path / "shared" / "datasets" / "corpus" / "v1").rglob("*"):
        if path.is_file():
            path.unlink()
    for path in sorted((tmp_path / "shared" / "datasets" / "corpus" / "v1").rglob("*"), reverse=True):
        path.rmdir()
    (tmp_path / "shared" / "datasets" / "corpus" / "v1").rmdir()
    missing = _run(config, "stage", "corpus")
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def test_the_stack_maps_s3_datasets_to_the_shared_filesystem() -> None:
    """s3://datasets/<path> is what the FSx data repository association of the datasets bucket shows
    under <shared path>/datasets (infra/backends/aws: file system path /datasets)."""
    local = load_platform(stack_file("local"))
    assert dataset_sources(local) == [
        {"name": "demo-corpus", "version": "v1", "source": "/shared/datasets/demo-corpus/v1"}
    ]


# --- in-process: the same program loaded as a module (tests/conftest.py load_script), so that a change to
# any of its functions fails a test here (scripts/mutation/run.py matches tests to functions this way)


@pytest.fixture(scope="module")
def cache_program() -> ModuleType:
    return load_script(PROGRAM)


def _main(program: ModuleType, config: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = program.main(["--config", str(config), *args])
    return code, out.getvalue(), err.getvalue()


def test_stage_verify_and_list_in_process(cache_program: ModuleType, tmp_path: Path) -> None:
    config = _setup(tmp_path)
    cached = tmp_path / "cache" / "corpus" / "v1"
    source = tmp_path / "shared" / "datasets" / "corpus" / "v1"
    assert _main(cache_program, config, "list") == (0, f"corpus\tv1\t-\t{source}\n", "")
    code, out, err = _main(cache_program, config, "stage", "corpus")
    assert (code, out) == (0, f"{cached}\n")
    assert err == f"corpus v1: staged from {source} to {cached}\n"
    manifest = json.loads((cached / "MANIFEST.json").read_text())
    assert manifest == {
        "version": "v1",
        "source": str(source),
        "files": {
            "index.json": {"size": 13, "sha256": hashlib.sha256(b'{"shards": 2}').hexdigest()},
            "shards/000.bin": {"size": 16384, "sha256": hashlib.sha256(bytes(range(256)) * 64).hexdigest()},
            "shards/001.bin": {"size": 1200, "sha256": hashlib.sha256(b"second shard" * 100).hexdigest()},
        },
    }
    assert _main(cache_program, config, "stage", "corpus") == (
        0,
        f"{cached}\n",
        f"corpus v1: cached at {cached}\n",
    )
    assert _main(cache_program, config, "verify", "corpus") == (0, "", "")
    assert _main(cache_program, config, "list") == (0, f"corpus\tv1\tcached\t{source}\n", "")
    (cached / "shards" / "001.bin").write_bytes(b"SECOND SHARD" * 100)
    (cached / "index.json").unlink()
    assert _main(cache_program, config, "verify", "corpus") == (
        1,
        "corpus v1: index.json: missing\n"
        "corpus v1: shards/001.bin: content differs from the source (SHA-256)\n",
        "",
    )
    assert _main(cache_program, config, "verify", "corpus", "--check", "size") == (
        1,
        "corpus v1: index.json: missing\n",
        "",
    )


def test_refusals_exit_2_in_process(cache_program: ModuleType, tmp_path: Path) -> None:
    config = _setup(tmp_path)
    code, out, err = _main(cache_program, config, "stage", "imagenet")
    assert (code, out) == (
        2,
        "",
    ) and err == "gpuplat-dataset: no dataset 'imagenet' in the stack (known: corpus)\n"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"cache_path": str(tmp_path / "cache")}))
    assert "(known: none)" in _main(cache_program, empty, "verify", "corpus")[2]
    assert _main(cache_program, empty, "list") == (0, "", "")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    code, _, err = _main(cache_program, broken, "list")
    assert code == 2 and err.startswith(f"gpuplat-dataset: {broken}: cannot read the dataset configuration (")
    moved = json.loads(config.read_text())
    moved["datasets"][0]["source"] = str(tmp_path / "gone")
    config.write_text(json.dumps(moved))
    assert _main(cache_program, config, "stage", "corpus")[2] == (
        f"gpuplat-dataset: dataset corpus version v1: source {tmp_path / 'gone'} is not a directory\n"
    )
    assert not (tmp_path / "cache").exists()  # nothing made for a dataset that cannot be staged


def test_jobs_starting_together_wait_for_the_first_copy(cache_program: ModuleType, tmp_path: Path) -> None:
    """The lock: while one job holds it, another job's stage waits, then finds the copy made."""
    config = _setup(tmp_path)
    lock_path = tmp_path / "cache" / "corpus" / ".lock"
    lock_path.parent.mkdir(parents=True)
    done: list[Path] = []
    with lock_path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = threading.Thread(
            target=lambda: done.append(
                cache_program.stage(json.loads(config.read_text()), "corpus", "full", io.StringIO())
            )
        )
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive() and not (tmp_path / "cache" / "corpus" / "v1").exists()
    waiting.join(timeout=10)
    assert done == [tmp_path / "cache" / "corpus" / "v1"]


def test_a_copy_that_differs_from_what_was_read_is_never_handed_out(
    cache_program: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check after the copy: a file whose written bytes differ from the bytes read (a failing disk, a
    source changed mid-copy) fails the stage, and no copy is left where a job would read it."""
    config = _setup(tmp_path)
    copy_hashed = cache_program.copy_hashed

    def bad_disk(source: Path, target: Path) -> dict[str, Any]:
        read = copy_hashed(source, target)
        if target.name == "001.bin":
            target.write_bytes(b"x" * read["size"])
        return read

    monkeypatch.setattr(cache_program, "copy_hashed", bad_disk)
    with pytest.raises(OSError, match=r"does not match what was read: shards/001.bin: content differs"):
        cache_program.stage(json.loads(config.read_text()), "corpus", "full", io.StringIO())
    assert [p.name for p in (tmp_path / "cache" / "corpus").iterdir()] == [".lock"]
    monkeypatch.setattr(cache_program, "copy_hashed", copy_hashed)
    assert _main(cache_program, config, "stage", "corpus")[0] == 0


def test_leftovers_and_unusable_copies_are_replaced(cache_program: ModuleType, tmp_path: Path) -> None:
    config = _setup(tmp_path)
    cached = tmp_path / "cache" / "corpus" / "v1"
    _main(cache_program, config, "stage", "corpus")
    (cached / "shards" / "000.bin").write_bytes(b"short")
    leftover = tmp_path / "cache" / "corpus" / ".staging-v1-1"
    (leftover / "deep").mkdir(parents=True)
    code, out, err = _main(cache_program, config, "stage", "corpus", "--check", "size")
    assert (code, out) == (0, f"{cached}\n") and not leftover.exists()
    assert (
        err.splitlines()[0]
        == "corpus v1: cached copy unusable (shards/000.bin: 5 bytes, expected 16384); staging again"
    )
    assert (cached / "shards" / "000.bin").read_bytes() == bytes(range(256)) * 64
