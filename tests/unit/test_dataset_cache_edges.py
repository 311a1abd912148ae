"""gpuplat-dataset (roles/slurm_compute/files/gpuplat_dataset_cache.py) at its edges, in this process
(tests/unit/test_dataset_cache.py `_main`, so that `make mutation` sees what they call): the modes of a
copy and of its locks, what `verify` prints for each fault, sources the cache refuses by name, what the
next stage tidies, the cache's own directories only (never a link out of it), the room on the disk and
under the cap counted to the byte (copies, other stages' reservations, the disk's margin)."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_dataset_cache import (
    INDEX,
    PROGRAM,
    SHARD0,
    SHARD1,
    _bytes_of_one,
    _hold,
    _main,
    _main_of,
    _one_error_line,
    _setup,
    load_script_quietly,
)

Usage = collections.namedtuple("Usage", "total used free")


def _stage(config: Path, name: str = "corpus") -> Path:
    done = _main(config, "stage", name)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _writable(path: Path) -> Path:
    path.chmod(0o644)
    return path


def test_a_copy_is_0755_directories_and_0444_files_and_its_locks_are_the_owners_alone(tmp_path: Path) -> None:
    """Every user reads and traverses a copy, none can change it; the lock files are 0600, so no other
    user can take a generation's readers' file exclusively and keep the cache from removing it."""
    config = _setup(tmp_path)
    copy = _stage(config)
    for path in [copy.parent.parent, copy.parent, copy, *copy.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o444), (path, oct(mode))
    version = copy.parent
    for lock in (version / ".lock", version / f".readers-{copy.name}", tmp_path / "cache" / ".lock"):
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600, lock


def test_a_lock_closed_twice_closes_nothing_else(tmp_path: Path) -> None:
    """`close` and then the end of its `with`: the second close must not close a descriptor the process
    has opened since (here stdout's)."""
    cache = load_script_quietly()
    saved = os.dup(1)
    try:
        with cache.Lock(tmp_path / "lock", fcntl.LOCK_EX, create=True) as lock:  # type: ignore[attr-defined]
            lock.close()
        os.fstat(1)  # still open
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@pytest.mark.parametrize(
    ("make", "named", "why"),
    [
        (
            lambda s: (s / "index.json").chmod(0o600),
            "index.json",
            "{} is not readable by every user (mode 600)",
        ),
        (lambda s: (s / "shards").chmod(0o750), "shards", "{} is not readable by every user (mode 750)"),
        (lambda s: s.chmod(0o700), "", "{} is not readable by every user (mode 700)"),
        (
            lambda s: (s / "link.bin").symlink_to(s / "index.json"),
            "link.bin",
            "{}: only regular files and directories",
        ),
    ],
    ids=["file", "folder", "source", "link"],
)
def test_a_source_the_cache_cannot_serve_every_user_is_refused_naming_the_path(
    tmp_path: Path, make: object, named: str, why: str
) -> None:
    """Mode bits decide (root reads a 0600 file too), and a link is never followed out of the source."""
    config = _setup(tmp_path)
    source = tmp_path / "shared" / "datasets" / "corpus" / "v1"
    make(source)  # type: ignore[operator]
    try:
        done = _main(config, "stage", "corpus")
    finally:
        source.chmod(0o755)
    _one_error_line(done, why.format(source / named if named else source))
    if "not readable" in why:
        assert done.stderr.endswith(
            ": the cache serves every user of the node; make the dataset world-readable or read it in place\n"
        )
    assert not (tmp_path / "cache" / "corpus" / "v1" / "current").exists()


def test_verify_prints_a_line_for_each_fault_and_withdraws_the_copy(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    label = "corpus v1"
    uncached = _main(config, "verify", "corpus")
    assert uncached.returncode == 1
    assert (uncached.stdout, uncached.stderr) == (
        f"{label}: not cached\n",
        f"gpuplat-dataset: {label}: not cached\n",
    )

    copy = _stage(config)
    (copy / "index.json").unlink()
    (copy / "shards" / "001.bin").unlink()
    (copy / "shards" / "000.bin").unlink()
    (copy / "shards" / "000.bin").mkdir()
    done = _main(config, "verify", "corpus")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"{label}: index.json: missing",
        f"{label}: shards/000.bin: not a regular file",
        f"{label}: shards/001.bin: missing",
    ]
    assert done.stderr == (
        f"gpuplat-dataset: {label}: {copy} failed the check and is withdrawn; the next stage copies it again "
        "(jobs reading it keep it until they end)\n"
    )
    assert not (copy.parent / "current").exists()


def _restaged(config: Path, copy: Path) -> None:
    """The copy is withdrawn and the next stage makes a new one that passes."""
    assert not (copy.parent / "current").exists()
    again = _stage(config)
    assert again != copy and (again / "index.json").read_text() == INDEX
    assert _main(config, "verify", "corpus").returncode == 0


def test_verify_names_a_manifest_changed_unreadable_or_of_another_source(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    copy = _stage(config)
    manifest, staged = _writable(copy / "MANIFEST.json"), _writable(copy / "STAGED.json")
    manifest.write_text(manifest.read_text() + " ")
    done = _main(config, "verify", "corpus")
    assert done.stdout == "corpus v1: the manifest digest differs from the one recorded when it was staged\n"
    _restaged(config, copy)

    # A manifest whose digest matches but that lists no files.
    copy = _stage(config)
    manifest, staged = _writable(copy / "MANIFEST.json"), _writable(copy / "STAGED.json")
    manifest.write_text("{}")
    record = json.loads(staged.read_text())
    record["manifest_sha256"] = hashlib.sha256(b"{}").hexdigest()
    staged.write_text(json.dumps(record))
    assert _main(config, "verify", "corpus").stdout == "corpus v1: no complete manifest\n"
    _restaged(config, copy)

    # A record that is JSON but not an object.
    copy = _stage(config)
    _writable(copy / "STAGED.json").write_text("[]")
    assert _main(config, "verify", "corpus").stdout == "corpus v1: no complete manifest\n"
    _restaged(config, copy)

    # The stack moved the version to another directory: the copy names where it came from.
    old = str(tmp_path / "shared" / "datasets" / "corpus" / "v1")
    moved = tmp_path / "moved"
    shutil.copytree(old, moved)
    document = json.loads(config.read_text())
    document["datasets"][0]["source"] = str(moved)
    config.write_text(json.dumps(document))
    assert _main(config, "verify", "corpus").stdout == f"corpus v1: staged from another source ({old} v1)\n"


def test_a_link_named_like_a_generation_is_never_handed_out_nor_counted(tmp_path: Path) -> None:
    """`current` naming g9, a link to a copy outside the cache (with a readers' file beside it): not the
    cache's own directory, so the stage copies again, into g2, and what the link names is left alone."""
    config = _setup(tmp_path)
    copy = _stage(config)
    version = copy.parent
    outside = tmp_path / "outside"
    shutil.copytree(copy, outside)
    (version / "g9").symlink_to(outside)
    (version / ".readers-g9").touch(mode=0o600)
    (version / "current").unlink()
    (version / "current").symlink_to("g9")
    staged = _main(config, "stage", "corpus")
    assert staged.returncode == 0 and "staged from" in staged.stderr, staged.stderr
    assert Path(staged.stdout.strip()) == version / "g2"
    assert (outside / "index.json").read_text() == INDEX


def test_a_version_whose_generation_counter_is_lost_never_reuses_a_number(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    copy = _stage(config)
    (copy.parent / ".generation").unlink()
    _writable(copy / "index.json").write_text("{")  # current, and unusable: it stays until replaced
    assert _stage(config) == copy.parent / "g2"


def test_the_next_stage_removes_what_killed_stages_left(tmp_path: Path) -> None:
    """A staging directory, a renamed-away generation, a half-made `current` link, a readers' file whose
    generation never got there: the next stage (of a copy already cached) removes each."""
    config = _setup(tmp_path)
    copy = _stage(config)
    version = copy.parent
    (version / ".staging-999" / "shards").mkdir(parents=True)
    (version / ".staging-999" / "shards" / "000.bin").write_bytes(SHARD0)
    (version / ".trash-g0-999").mkdir()
    (version / ".trash-g0-999" / "index.json").write_text(INDEX)
    (version / ".current-999").symlink_to("g7")
    (version / ".readers-g7").touch(mode=0o600)
    assert _stage(config) == copy
    assert sorted(p.name for p in version.iterdir()) == [
        ".generation",
        ".lock",
        ".readers-g1",
        "current",
        "g1",
    ]


def test_the_cache_walks_its_own_directories_only(tmp_path: Path) -> None:
    """A file and links in the cache (a dataset's and a version's): never taken for a version no longer in
    the stack, so nothing they name is removed."""
    config = _setup(tmp_path)
    cache = tmp_path / "cache"
    _stage(config)
    outside = tmp_path / "outside"
    for leftover in (outside / "v1" / ".staging-1", outside / "v1" / "g1", outside / "old" / ".staging-1"):
        leftover.mkdir(parents=True)
        (leftover / "data").write_text("not the cache's")
    (outside / "v1" / ".lock").touch()
    (outside / "old" / ".lock").touch()
    (cache / "notes").write_text("a file")
    (cache / "linked").symlink_to(outside)
    (cache / "corpus" / "old").symlink_to(outside / "old")
    (cache / "corpus" / "v0").write_text("a file")
    again = _main(config, "stage", "corpus")
    assert again.returncode == 0, again.stderr
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("data")) == [
        "old/.staging-1/data",
        "v1/.staging-1/data",
        "v1/g1/data",
    ]


def test_versions_no_longer_in_the_stack_are_removed_whatever_their_order_or_holders(tmp_path: Path) -> None:
    """Left: alpha (its stager at work: its lock held) and zulu, either side of the configured mike."""
    config = _setup(tmp_path, names=("alpha", "mike", "zulu"))
    for name in ("alpha", "mike", "zulu"):
        _stage(config, name)
    document = json.loads(config.read_text())
    document["datasets"] = [d for d in document["datasets"] if d["name"] == "mike"]
    config.write_text(json.dumps(document))
    cache = tmp_path / "cache"
    stager = os.open(cache / "alpha" / "v1" / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(stager, fcntl.LOCK_EX)
        _stage(config, "mike")
        assert (cache / "alpha" / "v1" / "g1").exists() and not (cache / "zulu" / "v1" / "g1").exists()
    finally:
        os.close(stager)
    _stage(config, "mike")
    assert not (cache / "alpha" / "v1" / "g1").exists()


def _reserve(version: Path, reservations: dict[str, str | None]) -> None:
    """Stages of another version at work: each has reserved bytes (None: killed before it wrote them)."""
    for name, reserved in reservations.items():
        staging = version / name
        staging.mkdir(parents=True)
        if reserved is not None:
            (staging / ".reserved").write_text(reserved)


def _with_cap(config: Path, cap: int) -> None:
    document = json.loads(config.read_text())
    document["cache_max_bytes"] = cap
    config.write_text(json.dumps(document))


def test_the_cap_counts_the_bytes_other_stages_have_reserved(tmp_path: Path) -> None:
    config = _setup(tmp_path, names=("alpha", "beta"))
    cache = tmp_path / "cache"
    cache.mkdir()
    _reserve(
        cache / "beta" / "v1",
        {".staging-1": None, ".staging-2": "1000", ".staging-3": "not a number", ".staging-4": "300"},
    )
    _with_cap(config, 1300 + _bytes_of_one() - 1)
    refused = _main(config, "stage", "alpha")
    _one_error_line(refused, f"no room for {_bytes_of_one()} bytes", "1300 bytes cached")
    _with_cap(config, 1300 + _bytes_of_one())
    assert _stage(config, "alpha").name == "g1"


def test_the_disk_keeps_its_margin_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room on the disk: its free space less DISK_MARGIN, to the byte."""
    cache = load_script_quietly()
    margin = cache.DISK_MARGIN  # type: ignore[attr-defined]
    config = _setup(tmp_path)
    free = {"bytes": _bytes_of_one() + margin - 1}
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda path: Usage(1 << 40, 0, free["bytes"]))  # type: ignore[attr-defined]
    refused = _main_of(cache, config, "stage", "corpus")
    _one_error_line(refused, f"(no cache_max_bytes, {free['bytes']} bytes free on its disk, 0 bytes cached")
    free["bytes"] += 1
    assert _main_of(cache, config, "stage", "corpus").returncode == 0


def test_a_copy_with_no_record_of_its_bytes_is_counted_by_its_files(tmp_path: Path) -> None:
    """alpha's STAGED.json lost: its files' bytes (not its folders') are what evicting it frees."""
    config = _setup(tmp_path, names=("alpha", "beta"))
    alpha = _stage(config, "alpha")
    (alpha / "STAGED.json").unlink()
    files = sum(p.stat().st_size for p in alpha.rglob("*") if p.is_file())
    assert files == _bytes_of_one() + (alpha / "MANIFEST.json").stat().st_size
    _with_cap(config, files + _bytes_of_one() - 1)
    beta = _main(config, "stage", "beta")
    assert beta.returncode == 0, beta.stderr
    assert f"evicted alpha v1 ({files} bytes)" in beta.stderr
    assert not alpha.exists()
    assert (Path(beta.stdout.strip()) / "shards" / "001.bin").read_bytes() == SHARD1


def test_a_copy_records_its_manifests_digest_bytes_files_and_when(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    before = time.time()
    copy = _stage(config)
    record = json.loads((copy / "STAGED.json").read_text())
    assert set(record) == {"manifest_sha256", "bytes", "files", "staged_at"}
    assert record["manifest_sha256"] == hashlib.sha256((copy / "MANIFEST.json").read_bytes()).hexdigest()
    assert (record["bytes"], record["files"]) == (_bytes_of_one(), 3)
    assert before <= record["staged_at"] <= time.time()


def test_stage_logs_what_it_did_and_why_it_copied_again(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    source = tmp_path / "shared" / "datasets" / "corpus" / "v1"
    first = _main(config, "stage", "corpus")
    copy = Path(first.stdout.strip())
    assert first.stderr == f"corpus v1: staged from {source} to {copy}\n"
    assert _main(config, "stage", "corpus").stderr == f"corpus v1: cached at {copy}\n"
    _writable(copy / "index.json").write_text("{")
    _writable(copy / "shards" / "001.bin").write_text("")
    again = _main(config, "stage", "corpus")
    assert again.stderr.splitlines() == [
        "corpus v1: cached copy unusable (index.json: 1 bytes, expected 13; shards/001.bin: 0 bytes, "
        f"expected {len(SHARD1)}); staging again",
        f"corpus v1: staged from {source} to {copy.parent / 'g2'}",
    ]


def test_a_copy_that_failed_its_check_makes_room_for_its_own_replacement(tmp_path: Path) -> None:
    """Under a cap with room for one copy, the corrupt copy is what a stage evicts to copy again (it was
    refused, "no room ... of which 0 in use by running jobs", while that copy stayed counted)."""
    config = _setup(tmp_path, cache_max_bytes=_bytes_of_one())
    copy = _stage(config)
    _writable(copy / "shards" / "001.bin").write_text("")
    again = _main(config, "stage", "corpus")
    assert again.returncode == 0, again.stderr
    assert f"corpus v1: evicted corpus v1 ({_bytes_of_one()} bytes)" in again.stderr.splitlines()
    assert Path(again.stdout.strip()) == copy.parent / "g2" and not copy.exists()
    assert _main(config, "verify", "corpus").returncode == 0


def test_stage_check_full_copies_again_what_only_a_hash_finds_changed(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    copy = _stage(config)
    _writable(copy / "shards" / "001.bin").write_bytes(b"SECOND SHARD" * 100)  # same size
    assert _stage(config) == copy
    full = _main(config, "stage", "corpus", "--check", "full")
    assert full.returncode == 0 and "001.bin: content differs" in full.stderr, full.stderr
    assert Path(full.stdout.strip()) == copy.parent / "g2"


def test_a_copy_that_differs_in_several_files_names_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = load_script_quietly()
    config = _setup(tmp_path)
    original = cache.copy_hashed  # type: ignore[attr-defined]

    def truncating(source: Path, target: Path) -> dict[str, object]:
        copied = original(source, target)
        _writable(target).write_bytes(b"")
        return dict(copied)

    monkeypatch.setattr(cache, "copy_hashed", truncating)
    done = _main_of(cache, config, "stage", "corpus")
    _one_error_line(
        done,
        "the copy does not match what was read: index.json: 0 bytes, expected 13; shards/000.bin: 0 bytes, "
        f"expected {len(SHARD0)}; shards/001.bin: 0 bytes, expected {len(SHARD1)}",
    )


def test_a_copy_being_made_counts_against_the_cap_for_another_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alpha's stage has reserved its bytes and is copying when beta's stage asks for room: one copy fits
    under the cap, two do not, so beta's is refused (nothing of alpha's can be evicted)."""
    cache = load_script_quietly()
    config = _setup(tmp_path, names=("alpha", "beta"), cache_max_bytes=2 * _bytes_of_one() - 1)
    original = cache.copy_hashed  # type: ignore[attr-defined]
    meanwhile: list[Any] = []

    def copying(source: Path, target: Path) -> dict[str, object]:
        if not meanwhile:  # the first file of alpha's (not of beta's, were it let through)
            meanwhile.append(None)
            meanwhile[0] = _main_of(cache, config, "stage", "beta")
        return dict(original(source, target))

    monkeypatch.setattr(cache, "copy_hashed", copying)
    assert _main_of(cache, config, "stage", "alpha").returncode == 0
    _one_error_line(
        meanwhile[0], f"beta v1: no room for {_bytes_of_one()} bytes", f"{_bytes_of_one()} bytes cached"
    )


def _used(copy: Path, when: float) -> None:
    os.utime(copy, (when, when))


def test_eviction_takes_versions_out_of_the_stack_first_then_the_least_recently_used(tmp_path: Path) -> None:
    config = _setup(tmp_path, names=("alpha", "beta", "gamma"))
    alpha, beta = _stage(config, "alpha"), _stage(config, "beta")
    _used(alpha, 1000)
    _used(beta, 2000)  # beta used last, but no longer in the stack
    document = json.loads(config.read_text())
    document["datasets"] = [d for d in document["datasets"] if d["name"] != "beta"]
    document["cache_max_bytes"] = 2 * _bytes_of_one()
    config.write_text(json.dumps(document))
    gamma = _main(config, "stage", "gamma")
    assert gamma.returncode == 0 and "evicted beta v1" in gamma.stderr and "alpha" not in gamma.stderr
    assert alpha.exists()


def test_the_cap_to_the_byte_and_what_is_in_use_is_never_evicted(tmp_path: Path) -> None:
    one = _bytes_of_one()
    names = ("alpha", "beta", "gamma", "delta")
    config = _setup(tmp_path, names=names, cache_max_bytes=3 * one)
    copies = {name: _stage(config, name) for name in names[:3]}  # exactly the cap: nothing evicted
    assert all(copy.exists() for copy in copies.values())
    for when, name in enumerate(names[:3]):
        _used(copies[name], 1000 + when)
    cache = tmp_path / "cache"

    def version_lock(name: str) -> int:  # its stager at work
        fd = os.open(cache / name / "v1" / ".lock", os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    held = [version_lock("alpha")]
    try:
        delta = _main(config, "stage", "delta")
        assert delta.returncode == 0 and "evicted beta v1" in delta.stderr, delta.stderr
        assert copies["alpha"].exists() and not copies["beta"].exists()
        copies["delta"] = Path(delta.stdout.strip())
        _used(copies["delta"], 1003)
        held += [version_lock("gamma"), _hold(copies["delta"])]
        refused = _main(config, "stage", "beta")
        _one_error_line(
            refused,
            f"beta v1: no room for {one} bytes in {cache} (cache_max_bytes {3 * one}, ",
            f" bytes free on its disk, {3 * one} bytes cached of which {3 * one} in use by running jobs): "
            "raise the cap or free the disk, or wait for those jobs",
        )
    finally:
        for fd in held:
            os.close(fd)
    _with_cap(config, 2 * one)  # two copies go for one
    beta = _main(config, "stage", "beta")
    assert beta.returncode == 0 and beta.stderr.count("evicted") == 2, beta.stderr
    # the two least recently used (alpha, gamma) went: what is left fits the cap
    assert sorted(name for name in names if (cache / name / "v1" / "current").exists()) == ["beta", "delta"]


# --- the command line, in this process --------------------------------------------------------------------


def test_an_unknown_dataset_is_refused_naming_those_the_stack_has(tmp_path: Path) -> None:
    config = _setup(tmp_path, names=("alpha", "beta"))
    _one_error_line(_main(config, "stage", "x"), "no dataset 'x' in the stack (known: alpha, beta)")
    document = json.loads(config.read_text())
    document["datasets"] = []
    config.write_text(json.dumps(document))
    _one_error_line(_main(config, "verify", "x"), "no dataset 'x' in the stack (known: none)")


def test_list_and_the_usage_of_the_node_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --config the node's configuration is read; `list` exits 0; the usage hides --as-owner
    (the program's own re-run as the owner) and shows what `run` takes."""
    cache = load_script_quietly()
    config = _setup(tmp_path)
    monkeypatch.setattr(cache, "CONFIG", config)
    listed = _main_of(cache, config, "list")
    assert listed.returncode == 0 and listed.stdout.startswith("corpus\tv1\t-\t")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cache.main(["list"]) == 0  # type: ignore[attr-defined]
    assert out.getvalue() == listed.stdout
    for argv, shown in (
        (["--help"], "gpuplat-dataset: the node's cache of the stack's datasets on local NVMe."),
        (["run", "--help"], "command -- COMMAND [ARGS...]"),
    ):
        usage = io.StringIO()
        with contextlib.redirect_stdout(usage), pytest.raises(SystemExit) as exited:
            cache.main(argv)  # type: ignore[attr-defined]
        lines = [" ".join(line.split()) for line in usage.getvalue().splitlines()]
        assert exited.value.code == 0 and shown in lines and "--as-owner" not in usage.getvalue()


def test_a_user_not_the_owner_stages_and_verifies_through_the_owners_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main as another user (geteuid): this program again as the owner (GPUPLAT_DATASET_BECOME: this
    Python, the test's user owning the cache), its output and exit status handed back; the owner's side
    refuses to run as anyone else."""
    cache = load_script_quietly()
    config = _setup(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(PROGRAM)])
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", sys.executable)
    uncached = _main_of(cache, config, "verify", "corpus")
    assert (uncached.returncode, uncached.stdout) == (1, "corpus v1: not cached\n")
    copy = tmp_path / "cache" / "corpus" / "v1" / "g1"
    staged = _main_of(cache, config, "stage", "corpus", "--check", "full")
    assert (staged.returncode, staged.stdout) == (0, f"{copy}\n")
    refused = _main_of(cache, config, "--as-owner", "stage", "corpus")
    _one_error_line(refused, f"ran as uid {owner + 4242}, but {tmp_path / 'cache'} belongs to uid {owner}")


@pytest.mark.parametrize("uid", [1, 1000])
def test_under_sudo_run_and_a_configuration_of_the_callers_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uid: int
) -> None:
    cache = load_script_quietly()
    config = _setup(tmp_path)
    monkeypatch.setattr(os, "getuid", lambda: uid)
    assert _main_of(cache, config, "stage", "corpus").returncode == 0  # not under sudo: a user's own cache
    monkeypatch.setenv("SUDO_UID", "1000")
    _one_error_line(
        _main_of(cache, config, "stage", "corpus"),
        f"gpuplat-dataset: under sudo only {cache.CONFIG} is read, not {config}",  # type: ignore[attr-defined]
    )
    _one_error_line(
        _main_of(cache, config, "run", "corpus", "--", "id"),
        "gpuplat-dataset: under sudo, run is refused (it would start a command as the cache's user)",
    )
    monkeypatch.setattr(os, "getuid", lambda: 0)  # root under sudo: its own configuration is read
    assert _main_of(cache, config, "stage", "corpus").returncode == 0


def test_hold_is_the_owners_side_of_run_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through main: `hold` alone is refused; with --as-owner (as `run` starts it) it stages with the check
    asked for, prints the held mark and no exit mark (its caller execs on the mark)."""
    cache = load_script_quietly()
    config = _setup(tmp_path)
    copy = _stage(config)
    _writable(copy / "shards" / "001.bin").write_bytes(b"SECOND SHARD" * 100)  # same size
    _one_error_line(
        _main_of(cache, config, "hold", "corpus"),
        "gpuplat-dataset: hold is what `run` starts as the cache's owner; use run",
    )
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    monkeypatch.setattr(os, "read", lambda fd, size: b"")  # the job has ended: EOF at once
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: fd2)  # this process's stdout stays the test's
    try:
        held = _main_of(cache, config, "--as-owner", "hold", "corpus", "--check", "full")
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert (held.returncode, held.stdout) == (0, f"{cache.HELD_MARK}{copy.parent / 'g2'}\n")  # type: ignore[attr-defined]


def test_stage_finds_the_copy_another_job_staged_while_it_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first look finds no copy; by the time the version's lock is had, another stage made one."""
    from tests.conftest import load_script

    taken = io.StringIO(), io.StringIO()  # stage logs to the stderr the program was loaded with
    with contextlib.redirect_stdout(taken[0]), contextlib.redirect_stderr(taken[1]):
        cache = load_script(PROGRAM)
    config = _setup(tmp_path)
    copy = _stage(config)
    usable = cache.usable  # type: ignore[attr-defined]
    looks: list[str] = []

    def racing(version: Path, entry: object, check: str) -> tuple[Path | None, str]:
        looks.append(check)
        return (None, "") if len(looks) == 1 else usable(version, entry, check)

    monkeypatch.setattr(cache, "usable", racing)
    done = _main_of(cache, config, "stage", "corpus", "--check", "full", taken=taken)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{copy}\n", f"corpus v1: cached at {copy}\n")
    assert looks == ["full", "full"]


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ([], "not a JSON object"),
        ({"cache_path": 5}, "cache_path must be an absolute path"),
        ({"cache_path": "cache"}, "cache_path must be an absolute path"),
        ({"cache_user": "Root!"}, "cache_user must be a user name"),
        ({"cache_max_bytes": -1}, "cache_max_bytes must be a whole number of bytes (0: no cap)"),
        ({"cache_max_bytes": True}, "cache_max_bytes must be a whole number of bytes (0: no cap)"),
        ({"cache_max_bytes": "5"}, "cache_max_bytes must be a whole number of bytes (0: no cap)"),
        ({"datasets": ""}, "datasets[0] needs name, version and source"),
        ({"datasets": [["corpus"]]}, "datasets[0] needs name, version and source"),
        (
            {"datasets": [{"name": "corpus", "version": "v 1", "source": "/data"}]},
            "datasets[0]: name and version are [A-Za-z0-9._-], source an absolute path",
        ),
        (
            {"datasets": [{"name": "-corpus", "version": "v1", "source": "/data"}]},
            "datasets[0]: name and version are [A-Za-z0-9._-], source an absolute path",
        ),
    ],
)
def test_a_bad_configuration_is_one_line_naming_the_field(tmp_path: Path, document: Any, why: str) -> None:
    config = tmp_path / "datasets.json"
    if isinstance(document, dict):
        document = {"cache_path": str(tmp_path / "cache"), **document}
    config.write_text(json.dumps(document))
    done = _main(config, "list")
    assert (done.returncode, done.stderr) == (
        2,
        f"gpuplat-dataset: {config}: {why} (roles/slurm_compute writes this file)\n",
    )


def test_a_configuration_without_datasets_lists_none(tmp_path: Path) -> None:
    config = tmp_path / "datasets.json"
    config.write_text(json.dumps({"cache_path": str(tmp_path / "cache")}))
    assert (_main(config, "list").returncode, _main(config, "list").stdout) == (0, "")


def test_the_cache_root_made_on_first_use_is_0755_whatever_the_umask(tmp_path: Path) -> None:
    """No cache_user (a developer's machine): the first stage makes the root, parents too; a loose umask
    would leave it group-writable, which the next run refuses."""
    config = _setup(tmp_path)
    document = json.loads(config.read_text())
    root = tmp_path / "nvme" / "gpuplat" / "cache"
    document["cache_path"] = str(root)
    config.write_text(json.dumps(document))
    umask = os.umask(0o002)
    try:
        assert _main(config, "stage", "corpus").returncode == 0
    finally:
        os.umask(umask)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert _main(config, "stage", "corpus").returncode == 0


def test_a_cache_root_that_is_no_folder_or_not_the_cache_users_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = load_script_quietly()
    root = tmp_path / "cache"
    config = tmp_path / "datasets.json"
    config.write_text(json.dumps({"cache_path": str(root), "datasets": []}))
    root.write_text("a file")
    assert _main_of(cache, config, "stage", "x").stderr == f"gpuplat-dataset: {root} is not a directory\n"
    root.unlink()
    root.mkdir(mode=0o755)
    root.chmod(0o775)
    assert _main_of(cache, config, "stage", "x").stderr == (
        f"gpuplat-dataset: {root} may be written by other users (mode 775): any of them could replace what "
        "jobs read; roles/slurm_compute makes it the cache user's, 0755\n"
    )
    root.chmod(0o755)
    config.write_text(json.dumps({"cache_path": str(root), "cache_user": "gpuplat-cache", "datasets": []}))
    uid = root.stat().st_uid

    def no_entry(uid: int) -> Any:
        raise KeyError(uid)

    monkeypatch.setattr(cache.pwd, "getpwuid", no_entry)  # type: ignore[attr-defined]
    assert _main_of(cache, config, "stage", "x").stderr == (
        f"gpuplat-dataset: {root} belongs to uid {uid}, not to the cache user gpuplat-cache: whoever owns it "
        "could change what every job reads; roles/slurm_compute makes it the cache user's\n"
    )


def test_the_owners_run_ends_with_its_exit_mark_and_an_interrupt_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--as-owner (this program run again as the owner): the last line on stdout is the exit mark, so its
    caller tells the program's status from sudo's; not after a hold that held (its caller execs on the
    held mark), after one that failed it is."""
    cache = load_script_quietly()
    mark = cache.EXIT_MARK  # type: ignore[attr-defined]
    config = _setup(tmp_path)
    copy = tmp_path / "cache" / "corpus" / "v1" / "g1"
    assert _main_of(cache, config, "--as-owner", "stage", "corpus").stdout == f"{copy}\n{mark}0\n"
    assert _main_of(cache, config, "--as-owner", "verify", "x").stdout == f"{mark}2\n"
    assert _main_of(cache, config, "--as-owner", "hold", "x").stdout == f"{mark}2\n"

    def interrupted(*args: object, **kwargs: object) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "stage", interrupted)
    done = _main_of(cache, config, "stage", "corpus")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "gpuplat-dataset: interrupted\n")


def test_a_hold_run_in_this_process_leaves_the_workers_signals_as_they_were(tmp_path: Path) -> None:
    """`hold` ignores SIGTERM, SIGINT and SIGHUP; run in process, that must not outlast it: a process this
    worker starts later inherits ignored signals (a later test's `sleep 60` outlived its SIGTERM)."""
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    cache = load_script_quietly()
    _main_of(cache, _setup(tmp_path), "--as-owner", "hold", "x")
    assert {number: signal.getsignal(number) for number in before} == before
