"""gpuplat-dataset (roles/slurm_compute/files/gpuplat_dataset_cache.py), the node's dataset cache, run
as the program jobs run: a version is copied once and reused by the next job; a corrupted, truncated or
half-staged copy is found and staged again, never handed out; unknown names are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infra.platform.resolve import load_platform
from infra.spec.load import stack_file
from infra.training.job_env import dataset_sources

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
