"""gpuplat-dataset (roles/slurm_compute/files/gpuplat_dataset_cache.py), the node's dataset cache, run
as the program jobs run (or its main in this process, _main, where one user stages, verifies and lists
copies, so that `make mutation` sees what those tests call): a version is copied once and reused by the
next job; a job start checks the copy cheaply (the manifest's digest and the files' sizes), staging and
`verify` hash every byte; a copy found bad is withdrawn and staged again into a new directory, never
rewritten under a job that reads it; the cache belongs to its own user and serves every user of the node;
it stays under its size cap by evicting the least recently used copy no job holds; every error is one
line and exit 2.

The tests of other users run as root (CI does) with numeric uids that need no passwd entry, switched to
with setpriv; `sudo -n -u gpuplat-cache` (what the role installs, tests/roles/test_dataset_cache_role.py)
is replaced by setpriv through GPUPLAT_DATASET_BECOME. Not modelled here: sudo's own policy and PAM
(the role test validates the sudoers drop-in with visudo), Slurm's cgroups."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.platform.resolve import load_platform
from infra.spec.load import stack_file
from infra.training.job_env import dataset_sources

PROGRAM = (
    Path(__file__).resolve().parents[2] / "roles" / "slurm_compute" / "files" / "gpuplat_dataset_cache.py"
)
# What the other users run it with: the system's Python (the venv's may sit under root's 0700 home).
SYSTEM_PYTHON = "/usr/bin/python3"
CACHE_UID, ALICE, BOB = 60999, 61001, 61002
SHARD0 = bytes(range(256)) * 64
SHARD1 = b"second shard" * 100
INDEX = '{"shards": 2}'

as_root = pytest.mark.skipif(
    os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists() or shutil.which("setpriv") is None,
    reason="other users on the node: needs root, setpriv and /usr/bin/python3 (CI runs as root)",
)


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory every uid can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gpuplat-dataset-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _source(base: Path, name: str = "corpus", payload: bytes = SHARD0) -> Path:
    source = base / "shared" / "datasets" / name / "v1"
    (source / "shards").mkdir(parents=True)
    (source / "shards" / "000.bin").write_bytes(payload)
    (source / "shards" / "001.bin").write_bytes(SHARD1)
    (source / "index.json").write_text(INDEX)
    for path in [source, *source.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    for parent in source.parents:
        if parent == base:
            break
        parent.chmod(0o755)
    return source


def _setup(
    base: Path, *, owner: int | None = None, names: tuple[str, ...] = ("corpus",), **extra: object
) -> Path:
    datasets = [{"name": n, "version": "v1", "source": str(_source(base, n))} for n in names]
    cache = base / "cache"
    if owner is not None:  # as the role makes it: the cache user's, 0755
        cache.mkdir()
        os.chown(cache, owner, owner)
        cache.chmod(0o755)
    config = base / "datasets.json"
    config.write_text(json.dumps({"cache_path": str(cache), "datasets": datasets, **extra}))
    config.chmod(0o644)
    return config


def _run(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def _main(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """_run's exit code and output from the program's main in this process (loaded while its output is
    taken: `stage` logs to the sys.stderr of its loading), where `make mutation` sees what it calls."""
    from tests.conftest import load_script

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        program = load_script(PROGRAM)
    return _main_of(program, config, *args, taken=(out, err))


def _main_of(
    program: Any, config: Path, *args: str, taken: tuple[io.StringIO, io.StringIO] | None = None
) -> subprocess.CompletedProcess[str]:
    """_main with the program already loaded (a test that replaced some of its functions); `taken`: the
    stdout and stderr it was loaded with. The signals the holder ignores (`hold_for_caller`) are given back
    after: ignored signals are inherited by every process this worker starts later, and a later test's
    `sleep` would then outlive its SIGTERM."""
    argv = ["--config", str(config), *args]
    out, err = taken or (io.StringIO(), io.StringIO())
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = program.main(argv)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


BECOME_OWNER = (
    f"setpriv --reuid={CACHE_UID} --regid={CACHE_UID} --clear-groups --inh-caps=-all --ambient-caps=-all "
    f"-- {SYSTEM_PYTHON}"
)


def _as(
    uid: int, *command: str, become: str = BECOME_OWNER, sudo_part: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run as uid with no supplementary group. With `sudo_part` it keeps CAP_SETUID/SETGID, only to run
    the BECOME command (what sudo does); without, it is a plain user."""
    switch = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    if sudo_part:
        switch += ["--inh-caps=+setuid,+setgid", "--ambient-caps=+setuid,+setgid"]
    switch += ["--inh-caps=-all", "--ambient-caps=-all"] if not sudo_part else []
    switch.append("--")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/", "GPUPLAT_DATASET_BECOME": become}
    return subprocess.run(
        [*switch, *command], capture_output=True, text=True, check=False, env=env, timeout=120
    )


def _user_stage(
    uid: int, config: Path, *args: str, become: str = BECOME_OWNER
) -> subprocess.CompletedProcess[str]:
    return _as(uid, SYSTEM_PYTHON, str(PROGRAM), "--config", str(config), *args, become=become)


def _one_error_line(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and lines, done.stderr
    assert lines[-1].startswith("gpuplat-dataset: "), done.stderr
    for text in expected:
        assert text in lines[-1], (text, done.stderr)


# --- one user -------------------------------------------------------------------------------------------


def test_a_version_is_staged_once_and_the_next_job_reuses_it(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    first = _main(config, "stage", "corpus")
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    assert path.parent == tmp_path / "cache" / "corpus" / "v1"
    assert (path.parent / "current").resolve() == path
    assert "staged from" in first.stderr
    assert (path / "shards" / "000.bin").read_bytes() == SHARD0
    inode = (path / "shards" / "000.bin").stat().st_ino
    second = _main(config, "stage", "corpus")
    assert second.returncode == 0 and Path(second.stdout.strip()) == path
    assert "cached at" in second.stderr and "staged from" not in second.stderr
    assert (path / "shards" / "000.bin").stat().st_ino == inode  # not copied again
    assert _main(config, "verify", "corpus").returncode == 0
    assert "corpus\tv1\tcached" in _main(config, "list").stdout
    # Read-only copies: a job's bug cannot change what the next job reads.
    assert not (path / "index.json").stat().st_mode & 0o222


def test_a_job_start_checks_sizes_and_the_manifest_digest_and_only_staging_or_verify_hash(
    tmp_path: Path,
) -> None:
    """`stage` at a job start does not read the whole dataset again: a same-size change is left to
    `verify` (and to `stage --check full`), which withdraws the copy; the next stage copies it again into
    a new directory and removes the bad one once no job holds it."""
    config = _setup(tmp_path)
    path = Path(_main(config, "stage", "corpus").stdout.strip())
    shard = path / "shards" / "001.bin"
    shard.chmod(0o644)
    shard.write_bytes(b"SECOND SHARD" * 100)  # same size, other bytes
    cheap = _main(config, "stage", "corpus")
    assert cheap.returncode == 0 and Path(cheap.stdout.strip()) == path and "cached at" in cheap.stderr
    verified = _main(config, "verify", "corpus")
    assert verified.returncode == 1 and "001.bin: content differs" in verified.stdout
    assert "withdrawn" in verified.stderr
    again = _main(config, "stage", "corpus")
    assert again.returncode == 0 and "staged from" in again.stderr, again.stderr
    new = Path(again.stdout.strip())
    assert new != path and (new / "shards" / "001.bin").read_bytes() == SHARD1
    assert not path.exists()  # no job held it

    full = _main(config, "stage", "corpus", "--check", "full")
    assert full.returncode == 0 and Path(full.stdout.strip()) == new


def test_a_truncated_copy_or_a_changed_manifest_is_never_handed_out(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    path = Path(_main(config, "stage", "corpus").stdout.strip())
    (path / "index.json").chmod(0o644)
    (path / "index.json").write_text("{")
    checked = _main(config, "verify", "corpus", "--check", "size")
    assert "index.json: 1 bytes, expected 13" in checked.stdout
    path = Path(_main(config, "stage", "corpus").stdout.strip())
    assert (path / "index.json").read_text() == INDEX
    # A manifest edited to match a truncated file: its own digest no longer matches.
    manifest = path / "MANIFEST.json"
    manifest.chmod(0o644)
    manifest.write_text(manifest.read_text().replace('"size": 13', '"size": 1'))
    staged = _main(config, "stage", "corpus")
    assert staged.returncode == 0 and "manifest digest" in staged.stderr and "staged from" in staged.stderr


def test_a_source_changed_for_the_same_version_is_staged_again(tmp_path: Path) -> None:
    """Day 2: the stack points the version at another directory; the copy of the old one is not it."""
    config = _setup(tmp_path)
    path = Path(_main(config, "stage", "corpus").stdout.strip())
    moved = tmp_path / "shared" / "moved"
    shutil.copytree(tmp_path / "shared" / "datasets" / "corpus" / "v1", moved)
    document = json.loads(config.read_text())
    document["datasets"][0]["source"] = str(moved)
    config.write_text(json.dumps(document))
    staged = _main(config, "stage", "corpus")
    assert staged.returncode == 0 and "another source" in staged.stderr and "staged from" in staged.stderr
    assert Path(staged.stdout.strip()) != path


def test_jobs_that_start_together_share_one_copy(tmp_path: Path) -> None:
    """Four stages at once on an empty cache (the first job's tasks on one node): one copies, the others
    wait for it and find it; all are handed the same directory."""
    config = _setup(tmp_path)
    command = [sys.executable, str(PROGRAM), "--config", str(config), "stage", "corpus"]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    results = [process.communicate(timeout=120) for process in processes]
    assert all(process.returncode == 0 for process in processes), results
    assert len({out.strip() for out, _ in results}) == 1
    assert sum("staged from" in err for _, err in results) == 1
    assert sum("cached at" in err for _, err in results) == 3


def test_a_kill_at_every_step_of_a_stage_leaves_nothing_the_next_stage_hands_out(tmp_path: Path) -> None:
    """What a stage killed between two of its steps leaves: a copy without its manifest, a whole copy
    not yet renamed, a renamed copy `current` does not name, a new `current` link not renamed into place,
    a removal cut off half-way. The next stage hands out an intact copy and removes the rest."""
    config = _setup(tmp_path)
    path = Path(_run(config, "stage", "corpus").stdout.strip())
    version = path.parent
    partial = version / ".staging-999"
    shutil.copytree(path, partial)
    (partial / "MANIFEST.json").unlink()
    shutil.copytree(path, version / ".staging-998")
    shutil.copytree(path, version / "g7")
    (version / ".current-997").symlink_to("g7")
    (version / ".readers-g9").write_text("")  # made just before a rename that never came
    trash = version / ".trash-g5"
    (trash / "shards").mkdir(parents=True)
    staged = _run(config, "stage", "corpus")
    assert staged.returncode == 0 and Path(staged.stdout.strip()) == path, staged.stderr
    expected = [".generation", ".lock", f".readers-{path.name}", "current", path.name]
    assert sorted(p.name for p in version.iterdir()) == expected

    # `current` naming a directory that is gone (removed by hand): staged again.
    shutil.rmtree(path)
    again = _run(config, "stage", "corpus")
    assert again.returncode == 0 and "staged from" in again.stderr
    assert (Path(again.stdout.strip()) / "index.json").read_text() == INDEX


def test_a_stage_killed_mid_copy_is_recovered_by_the_next(tmp_path: Path) -> None:
    """SIGKILL while the copy is written (a large shard, the process stopped at once when its staging
    directory shows up): no copy is handed out, and the next stage completes."""
    config = _setup(tmp_path)
    big = tmp_path / "shared" / "datasets" / "corpus" / "v1" / "shards" / "002.bin"
    with big.open("wb") as handle:
        handle.truncate(128 << 20)
    process = subprocess.Popen(
        [sys.executable, str(PROGRAM), "--config", str(config), "stage", "corpus"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    version = tmp_path / "cache" / "corpus" / "v1"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(version.glob(".staging-*/shards")):
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (version / "current").exists()
    staged = _run(config, "stage", "corpus")
    assert staged.returncode == 0, staged.stderr
    assert (Path(staged.stdout.strip()) / "shards" / "002.bin").stat().st_size == 128 << 20
    assert not list(version.glob(".staging-*"))


# --- readers, restaging, the size cap ------------------------------------------------------------------


def _readers(path: Path) -> Path:
    return path.parent / f".readers-{path.name}"


def _hold(path: Path) -> int:
    """A job reading the copy: a shared lock on its readers' file (what `gpuplat-dataset run`'s holder
    takes as the cache's owner; this test runs as the owner or root)."""
    fd = os.open(_readers(path), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def test_a_copy_a_job_reads_is_never_removed_under_it(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    path = Path(_run(config, "stage", "corpus").stdout.strip())
    reader = _hold(path)
    try:
        (path / "index.json").chmod(0o644)
        (path / "index.json").write_text("{")  # found at the next job start (sizes)
        restaged = _run(config, "stage", "corpus")
        assert restaged.returncode == 0 and "staged from" in restaged.stderr
        new = Path(restaged.stdout.strip())
        assert new != path and (new.parent / "current").resolve() == new
        assert (path / "shards" / "000.bin").read_bytes() == SHARD0  # the reader's copy is still whole
        assert _run(config, "stage", "corpus").returncode == 0 and path.exists()
    finally:
        os.close(reader)
    assert _run(config, "stage", "corpus").returncode == 0 and not path.exists()


def test_run_holds_the_copy_for_the_command_it_starts(tmp_path: Path) -> None:
    """`gpuplat-dataset run NAME -- COMMAND`: the command gets GPUPLAT_DATASET_PATH, and a holder (the
    program as the cache's owner) keeps a shared lock on that copy until the command, and whatever
    inherited the holder's pipe, has ended."""
    config = _setup(tmp_path)
    probe = (
        "import fcntl, os, sys\n"
        "path = os.environ['GPUPLAT_DATASET_PATH']\n"
        "readers = os.path.join(os.path.dirname(path), '.readers-' + os.path.basename(path))\n"
        "fd = os.open(readers, os.O_RDONLY)\n"
        "try:\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "    print('not held')\n"
        "except BlockingIOError:\n"
        "    print('held', path)\n"
        "sys.exit(7)\n"
    )
    done = _run(config, "run", "corpus", "--", sys.executable, "-c", probe)
    assert done.returncode == 7, done.stderr  # the command's own exit status
    word, path = done.stdout.split()
    assert word == "held" and Path(path).parent == tmp_path / "cache" / "corpus" / "v1"
    # The command has ended: the holder let go (its pipe closed), the copy can be removed.
    released = _readers(Path(path))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        fd = os.open(released, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.05)
        finally:
            os.close(fd)
    else:
        raise AssertionError("the holder kept the copy after the command ended")
    missing = _run(config, "run", "corpus", "--", str(tmp_path / "no-such-program"))
    _one_error_line(missing, "no-such-program")


def _bytes_of_one() -> int:
    return len(SHARD0) + len(SHARD1) + len(INDEX)


def test_the_cache_stays_under_its_cap_by_evicting_the_least_recently_used_copy_no_job_holds(
    tmp_path: Path,
) -> None:
    config = _setup(tmp_path, names=("alpha", "beta", "gamma"), cache_max_bytes=2 * _bytes_of_one() + 100)
    alpha = Path(_main(config, "stage", "alpha").stdout.strip())
    beta = Path(_main(config, "stage", "beta").stdout.strip())
    time.sleep(0.05)
    assert _main(config, "stage", "alpha").returncode == 0  # alpha used last: beta is the LRU
    gamma = _main(config, "stage", "gamma")
    assert gamma.returncode == 0 and "evicted beta v1" in gamma.stderr, gamma.stderr
    assert alpha.exists() and not beta.exists() and "beta\tv1\t-" in _main(config, "list").stdout
    # the evicted copy's files are gone, not only renamed away: the cap is kept on the disk
    assert not list((tmp_path / "cache" / "beta" / "v1").glob(".trash-*"))

    # Every other copy held by a running job: the stage is refused, whole, before copying anything.
    readers = [_hold(alpha), _hold(Path(gamma.stdout.strip()))]
    try:
        refused = _main(config, "stage", "beta")
        _one_error_line(refused, "cache_max_bytes", "in use")
        assert not list((tmp_path / "cache" / "beta" / "v1").glob(".staging-*"))
    finally:
        for fd in readers:
            os.close(fd)
    assert _main(config, "stage", "beta").returncode == 0


def test_a_version_no_longer_in_the_stack_is_removed_once_no_job_holds_it(tmp_path: Path) -> None:
    config = _setup(tmp_path, names=("alpha", "beta"))
    alpha = Path(_main(config, "stage", "alpha").stdout.strip())
    document = json.loads(config.read_text())
    document["datasets"] = [d for d in document["datasets"] if d["name"] == "beta"]
    config.write_text(json.dumps(document))
    reader = _hold(alpha)
    try:
        assert _main(config, "stage", "beta").returncode == 0 and alpha.exists()
    finally:
        os.close(reader)
    assert _main(config, "stage", "beta").returncode == 0 and not alpha.exists()


# --- bad input and failures: one line, exit 2 ---------------------------------------------------------


def test_unknown_datasets_and_missing_sources_are_refused(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    unknown = _main(config, "stage", "imagenet")
    _one_error_line(unknown, "no dataset 'imagenet'", "corpus")
    shutil.rmtree(tmp_path / "shared" / "datasets" / "corpus" / "v1")
    _one_error_line(_main(config, "stage", "corpus"), "is not a directory")
    config.write_text("{")
    _one_error_line(_main(config, "stage", "corpus"), "cannot read the dataset configuration")
    config.write_text(json.dumps({"cache_path": "relative", "datasets": [{"name": "x"}]}))
    _one_error_line(_main(config, "stage", "x"), "datasets.json")
    # The cache's root: the configured cache user's, and no one else may write to it.
    cache = tmp_path / "owned"
    document = {"cache_path": str(cache), "cache_user": "gpuplat-nobody-here", "datasets": []}
    config.write_text(json.dumps(document))
    _one_error_line(_main(config, "stage", "x"), "does not exist", "roles/slurm_compute")
    cache.mkdir()
    _one_error_line(_main(config, "stage", "x"), "not to the cache user gpuplat-nobody-here")
    del document["cache_user"]
    config.write_text(json.dumps(document))
    cache.chmod(0o1777)  # the layout before the cache had a user: anyone could replace a copy
    _one_error_line(_main(config, "stage", "x"), "may be written by other users")


def test_a_source_that_vanishes_mid_copy_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    config = _setup(tmp_path)
    source = tmp_path / "shared" / "datasets" / "corpus" / "v1"
    script = (
        "import importlib.util, shutil, sys\n"
        f"spec = importlib.util.spec_from_file_location('cache', {str(PROGRAM)!r})\n"
        "cache = importlib.util.module_from_spec(spec); sys.modules['cache'] = cache\n"
        "spec.loader.exec_module(cache)\n"
        "copy = cache.copy_hashed\n"
        "def vanishing(source, target):\n"
        f"    shutil.rmtree({str(source)!r}, ignore_errors=True)\n"
        "    return copy(source, target)\n"
        "cache.copy_hashed = vanishing\n"
        f"sys.exit(cache.main(['--config', {str(config)!r}, 'stage', 'corpus']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    _one_error_line(done, "corpus v1", "No such file")
    version = tmp_path / "cache" / "corpus" / "v1"
    assert not list(version.glob(".staging-*")) and not (version / "current").exists()


needs_mounts = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a full disk: a small tmpfs in a mount namespace needs root and unshare (CI runs as root)",
)


@needs_mounts
@pytest.mark.parametrize("lie_about_space", [False, True])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path, lie_about_space: bool) -> None:
    """A cache disk too small: refused before copying (its free space is read first). Another writer
    filling the disk during the copy (free space read as plenty): ENOSPC, reported, staging removed."""
    config = _setup(tmp_path)
    (tmp_path / "shared" / "datasets" / "corpus" / "v1" / "shards" / "000.bin").write_bytes(b"x" * (3 << 20))
    cache = tmp_path / "cache"
    cache.mkdir()
    script = (
        "import collections, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('cache', {str(PROGRAM)!r})\n"
        "cache = importlib.util.module_from_spec(spec); sys.modules['cache'] = cache\n"
        "spec.loader.exec_module(cache)\n"
        "Usage = collections.namedtuple('Usage', 'total used free')\n"
        f"if {lie_about_space}:\n"
        "    cache.shutil.disk_usage = lambda path: Usage(1 << 40, 0, 1 << 40)\n"
        f"code = cache.main(['--config', {str(config)!r}, 'stage', 'corpus'])\n"
        f"import os; print(sorted(os.listdir({str(cache / 'corpus' / 'v1')!r})))\n"
        "sys.exit(code)\n"
    )
    mount = f'mount -t tmpfs -o size=1m,mode=0755 gpuplat-test-full {cache} && exec {sys.executable} -c "$1"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", script],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    _one_error_line(done, "corpus v1")
    assert ("No space left" if lie_about_space else "free on") in done.stderr
    assert done.stdout.strip() == "['.lock']", done.stdout


# --- more than one user -----------------------------------------------------------------------------------


@as_root
def test_a_second_user_reads_the_copy_the_first_staged_and_cannot_change_it(world: Path) -> None:
    """Two users with no group in common stage the same dataset: the second finds the first's copy,
    and neither can change, remove or replace what the other's jobs read."""
    config = _setup(world, owner=CACHE_UID)
    first = _user_stage(ALICE, config, "stage", "corpus")
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    second = _user_stage(BOB, config, "stage", "corpus")
    assert second.returncode == 0 and Path(second.stdout.strip()) == path, second.stderr
    assert "cached at" in second.stderr
    assert _user_stage(BOB, config, "verify", "corpus").returncode == 0
    held = _user_stage(BOB, config, "run", "corpus", "--", "cat", "/proc/self/status")
    assert held.returncode == 0 and "Uid:\t61002" in held.stdout, held.stderr  # the job runs as its user
    cache = world / "cache"
    for entry in [cache, *cache.rglob("*")]:
        status = entry.lstat()
        if stat.S_ISLNK(status.st_mode):
            continue  # `current`: a link's own mode means nothing
        assert status.st_uid == CACHE_UID and not status.st_mode & 0o022, (entry, oct(status.st_mode))
    tamper = (
        "import os, sys\n"
        "path, version = sys.argv[1], os.path.dirname(sys.argv[1])\n"
        "attempts = {\n"
        "    'append': lambda: open(os.path.join(path, 'index.json'), 'a').close(),\n"
        "    'chmod': lambda: os.chmod(os.path.join(path, 'index.json'), 0o666),\n"
        "    'unlink': lambda: os.unlink(os.path.join(path, 'shards', '000.bin')),\n"
        "    'plant': lambda: open(os.path.join(path, 'extra'), 'w').close(),\n"
        "    'repoint': lambda: os.symlink('/tmp', os.path.join(version, 'current.x')),\n"
        "    'rename': lambda: os.rename(path, path + '.x'),\n"
        "    'lock': lambda: open(os.path.join(version, '.lock'), 'a').close(),\n"
        "    'block': lambda: open(os.path.join(version, '.readers-' + os.path.basename(path))).close(),\n"
        "    'stall': lambda: open(os.path.join(version, '.lock')).close(),\n"
        "}\n"
        "for name, attempt in attempts.items():\n"
        "    try:\n"
        "        attempt()\n"
        "        print('ALLOWED', name)\n"
        "    except PermissionError:\n"
        "        pass\n"
    )
    for user in (ALICE, BOB):
        done = _as(user, SYSTEM_PYTHON, "-c", tamper, str(path), sudo_part=False)
        assert done.returncode == 0 and "ALLOWED" not in done.stdout, (user, done.stdout, done.stderr)


@as_root
def test_a_user_who_cannot_become_the_cache_owner_gets_one_line(world: Path) -> None:
    config = _setup(world, owner=CACHE_UID)
    done = _user_stage(ALICE, config, "stage", "corpus", become="/nonexistent/sudo -n -u gpuplat-cache --")
    _one_error_line(done, "cannot run as the cache owner", "/nonexistent/sudo")
    refused = _user_stage(ALICE, config, "stage", "corpus", become="false")
    _one_error_line(refused, "cannot run as the cache owner")


@as_root
def test_under_sudo_only_the_node_configuration_is_read(world: Path) -> None:
    """A user could otherwise point the cache's owner at a configuration of their own (their directory
    as the source of the stack's dataset) and poison every job's copy."""
    config = _setup(world, owner=CACHE_UID)
    as_sudo = f"env SUDO_UID={ALICE} {BECOME_OWNER}"
    done = _user_stage(ALICE, config, "stage", "corpus", become=as_sudo)
    _one_error_line(done, "/etc/gpuplat/datasets.json")
    # Nor a command of theirs as the cache's user (`sudo -u gpuplat-cache gpuplat-dataset run X -- sh`).
    owner = ["setpriv", f"--reuid={CACHE_UID}", f"--regid={CACHE_UID}", "--clear-groups", "--"]
    shell = subprocess.run(
        ["env", f"SUDO_UID={ALICE}", *owner, SYSTEM_PYTHON, str(PROGRAM), "run", "corpus", "--", "id"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    _one_error_line(shell, "under sudo, run is refused")
    assert "uid=" not in shell.stdout


@as_root
def test_a_dataset_not_readable_by_every_user_is_not_cached(world: Path) -> None:
    """The cache serves every user of the node: a source only some may read would leak through it."""
    config = _setup(world, owner=CACHE_UID)
    (world / "shared" / "datasets" / "corpus" / "v1" / "index.json").chmod(0o640)
    _one_error_line(_run(config, "stage", "corpus"), "not readable by every user", "index.json")
    _one_error_line(_user_stage(ALICE, config, "stage", "corpus"), "not readable by every user")


def test_the_stack_maps_s3_datasets_to_the_shared_filesystem() -> None:
    """s3://datasets/<path> is what the FSx data repository association of the datasets bucket shows
    under <shared path>/datasets (infra/backends/aws: file system path /datasets)."""
    local = load_platform(stack_file("local"))
    assert dataset_sources(local) == [
        {"name": "demo-corpus", "version": "v1", "source": "/shared/datasets/demo-corpus/v1"},
        {"name": "text-pairs", "version": "v1", "source": "/shared/datasets/text-pairs/v1"},
    ]


def test_a_copy_that_differs_from_what_was_read_is_never_handed_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check after the copy: a byte that changed between reading the source and the copy on disk (a
    bad disk, a bad page) makes the stage fail, and leaves no generation and no `current` behind."""
    from tests.conftest import load_script

    cache = load_script(PROGRAM)
    config = _setup(tmp_path)
    original = cache.copy_hashed

    def flipping(source: Path, target: Path) -> dict[str, object]:
        copied = original(source, target)
        if target.name == "000.bin":
            data = bytearray(target.read_bytes())
            data[0] ^= 0xFF
            target.chmod(0o644)
            target.write_bytes(bytes(data))
        return dict(copied)

    monkeypatch.setattr(cache, "copy_hashed", flipping)
    with pytest.raises(cache.CacheError, match="does not match what was read"):
        cache.stage(cache.load_config(config), "corpus", "size", log=open(os.devnull, "w"))  # noqa: SIM115
    version = tmp_path / "cache" / "corpus" / "v1"
    assert not list(version.glob("g*")) and not (version / "current").exists()
    assert not [p for p in version.iterdir() if p.name.startswith(".staging")]


def test_files_of_several_chunks_two_folders_down_are_copied_whole_and_verify_reads_every_byte(
    tmp_path: Path,
) -> None:
    """A file longer than one read keeps its whole size and digest in the manifest; `verify` (a full
    check by default) finds a byte changed in its last chunk; a copy without its manifest is no copy."""
    from tests.conftest import load_script

    chunk = load_script(PROGRAM).CHUNK
    source = tmp_path / "shared" / "deep" / "v2"
    (source / "a" / "b").mkdir(parents=True)
    payload = bytes(range(256)) * (chunk // 256) + b"tail" * 1000
    (source / "a" / "b" / "big.bin").write_bytes(payload)
    config = tmp_path / "datasets.json"
    datasets = [{"name": "deep", "version": "v2", "source": str(source)}]
    config.write_text(json.dumps({"cache_path": str(tmp_path / "cache"), "datasets": datasets}))
    staged = _main(config, "stage", "deep")
    assert staged.returncode == 0, staged.stderr
    path = Path(staged.stdout.strip())
    files = json.loads((path / "MANIFEST.json").read_text())["files"]
    assert files == {"a/b/big.bin": {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}
    big = path / "a" / "b" / "big.bin"
    big.chmod(0o644)
    big.write_bytes(payload[:-1] + b"!")
    verified = _main(config, "verify", "deep")
    assert (verified.returncode, verified.stdout) == (
        1,
        "deep v2: a/b/big.bin: content differs from the source (SHA-256)\n",
    )
    again = Path(_main(config, "stage", "deep").stdout.strip())
    (again / "MANIFEST.json").unlink()
    assert _main(config, "verify", "deep").stdout == "deep v2: no complete manifest\n"


def test_the_programs_usage_and_where_the_role_puts_its_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import load_script

    cache = load_script(PROGRAM)
    with pytest.raises(SystemExit) as shown:
        cache.main(["--help"])
    usage = capsys.readouterr().out
    assert shown.value.code == 0 and usage.startswith("usage: gpuplat-dataset [-h] [--config CONFIG]")
    assert "gpuplat-dataset: the node's cache of the stack's datasets on local NVMe." in usage
    for wrong in ([], ["stage", "corpus", "--check", "quick"], ["run"]):
        with pytest.raises(SystemExit) as refused:
            cache.main(wrong)
        assert refused.value.code == 2
    for command, default in (("stage", "size"), ("verify", "full"), ("run", "size")):
        assert cache.parse([command, "corpus"]).check == default
    tasks = (PROGRAM.parents[1] / "tasks" / "dataset_cache.yml").read_text()
    assert f"dest: {cache.CONFIG}\n" in tasks  # what the program reads without --config


def test_a_user_not_the_owner_runs_the_program_again_as_the_owner_through_sudo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How `stage` and `verify` of anyone but root and the cache's owner become the owner: this program
    again, through `sudo -n -u` (or GPUPLAT_DATASET_BECOME), its stdout handed back less the exit mark."""
    from tests.conftest import load_script

    cache = load_script(PROGRAM)
    path = _setup(tmp_path)
    config = cache.load_config(path)
    owner = cache.cache_owner(config)[0]
    program = os.path.realpath(PROGRAM)
    monkeypatch.setattr(sys, "argv", [str(PROGRAM)])
    tail = ["--config", str(path), "--as-owner", "stage", "corpus"]
    assert cache.owner_command(config, ["stage", "corpus"]) == (
        [sys.executable, program, *tail],
        sys.executable,
    )
    code, out = cache.as_owner(config, ["stage", "corpus", "--check", "size"])
    assert (code, out) == (0, f"{tmp_path / 'cache' / 'corpus' / 'v1' / 'g1'}\n")

    monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)
    sudo = ["sudo", "-n", "-u", f"#{owner}", "--"]
    assert cache.owner_command(config, ["stage", "corpus"]) == ([*sudo, program, *tail], shlex.join(sudo))
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", "setpriv --reuid={user} --")
    assert cache.owner_command(config, ["verify", "x"])[0][:3] == ["setpriv", f"--reuid=#{owner}", "--"]
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", "false")
    with pytest.raises(
        cache.CacheError, match=r"^cannot run as the cache owner through `false` \(exit 1, see above;"
    ):
        cache.as_owner(config, ["stage", "corpus", "--check", "size"])
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", str(tmp_path / "no-sudo"))
    with pytest.raises(cache.CacheError, match=r"No such file or directory.*installs the sudoers rule"):
        cache.as_owner(config, ["stage", "corpus", "--check", "size"])
    with pytest.raises(
        cache.CacheError, match=rf"^cannot run as the cache owner through `{tmp_path}/no-sudo` "
    ):
        cache.as_owner(config, ["stage", "corpus", "--check", "size"])
    # The owner's output, however many lines, is handed back whole; its last line is the exit mark.
    monkeypatch.setenv(
        "GPUPLAT_DATASET_BECOME", f"sh -c 'echo first; echo second; echo {cache.EXIT_MARK}3' sh"
    )
    code, out = cache.as_owner(config, ["verify", "corpus"])
    assert (code, out.splitlines()[:2]) == (3, ["first", "second"])
    # Root runs it directly (it drops to the owner itself), never through sudo.
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cache.owner_command(config, ["stage", "corpus"])[0][:2] == [sys.executable, program]
    # so also where the cache's owner is another user (the suite's caches are root's own)
    monkeypatch.setattr(cache, "cache_owner", lambda config: (owner + 4242, owner + 4242))
    assert cache.owner_command(config, ["stage", "corpus"])[0][:2] == [sys.executable, program]


# --- run and its holder, in this process (what `make mutation` sees them do) ------------------------------


def _is_held(path: Path) -> bool:
    """Whether a reader holds the copy at `path` (an exclusive lock on its readers' file is refused)."""
    fd = os.open(_readers(path), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_holder_prints_the_copy_keeps_it_until_eof_and_ignores_the_jobs_signals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hold` (what `run` starts as the cache's owner): stages, prints the held mark with the copy's path,
    keeps a shared lock on it until EOF on its stdin, and lets SIGTERM, SIGINT and SIGHUP pass (a job in
    its grace time still reads); the copy is free once it returns."""
    import threading

    cache = load_script_quietly()
    config = cache.load_config(_setup(tmp_path))
    to_holder, holder_in = os.pipe()
    from_holder, holder_out = os.pipe()
    seen: dict[str, object] = {}

    def caller() -> None:
        with os.fdopen(from_holder) as lines:
            first = lines.readline()
            seen["line"] = first
            path = Path(first.strip().removeprefix(cache.HELD_MARK))
            seen["held"] = _is_held(path)
            seen["signals"] = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
            seen["rest"] = lines.read()  # the holder's stdout is closed to the caller once it has printed
        os.close(holder_in)  # the job has ended: EOF

    saved_fds = os.dup(0), os.dup(1)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    thread = threading.Thread(target=caller)
    try:
        os.dup2(to_holder, 0)
        os.dup2(holder_out, 1)
        os.close(to_holder)
        os.close(holder_out)
        # print() to fd 1 itself, as in the holder's process (the test's sys.stdout is pytest's capture)
        monkeypatch.setattr(sys, "stdout", os.fdopen(1, "w", closefd=False))
        thread.start()
        with contextlib.redirect_stderr(io.StringIO()):
            assert cache.hold_for_caller(config, "corpus", "size") == 0
    finally:
        os.dup2(saved_fds[0], 0)
        os.dup2(saved_fds[1], 1)
        for fd in saved_fds:
            os.close(fd)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        thread.join(timeout=30)
    copy = tmp_path / "cache" / "corpus" / "v1" / "g1"
    assert seen["line"] == f"{cache.HELD_MARK}{copy}\n"
    assert seen["held"] is True and seen["rest"] == ""
    assert seen["signals"] == [signal.SIG_IGN] * 3
    assert not _is_held(copy)


def test_the_holder_stages_again_when_the_copy_goes_before_it_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy withdrawn between its stage and the holder's lock is staged again, with the check the caller
    asked for each time; after five such losses the holder gives up with one line."""
    cache = load_script_quietly()
    config = cache.load_config(_setup(tmp_path))
    staged: list[tuple[str, str]] = []
    stage, hold = cache.stage, cache.hold

    def counted(config: object, name: str, check: str) -> Path:
        staged.append((name, check))
        return Path(stage(config, name, check))

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    monkeypatch.setattr(os, "read", lambda fd, size: b"")  # the caller has gone: EOF at once
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: fd2)  # this process's stdout stays the test's
    monkeypatch.setattr(cache, "stage", counted)
    try:
        # stage itself holds the copy it hands back (hold_current): only the holder's own hold is lost
        monkeypatch.setattr(cache, "hold", lambda path: None if len(staged) == 1 else hold(path))
        with contextlib.redirect_stderr(io.StringIO()):
            assert cache.hold_for_caller(config, "corpus", "full") == 0
        assert staged == [("corpus", "full")] * 2 and sys.stdout.getvalue().startswith(cache.HELD_MARK)
        monkeypatch.setattr(cache, "hold", lambda path: None)
        with (
            contextlib.redirect_stderr(io.StringIO()),
            pytest.raises(
                cache.CacheError, match=r"^corpus: the copy was removed each time before it could be held$"
            ),
        ):
            cache.hold_for_caller(config, "corpus", "size")
        assert len(staged) == 2 + 5
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def load_script_quietly() -> object:
    """The program loaded as a module (`stage` logs to the stderr it was loaded with: kept quiet)."""
    from tests.conftest import load_script

    with contextlib.redirect_stderr(io.StringIO()):
        return load_script(PROGRAM)


class _Started(Exception):
    """What the test's execvpe raises in place of replacing this process with the command."""


@pytest.fixture
def holders(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The holders `run` starts in this process, ended and waited for after the test: a child left to be
    reaped by whoever waits next is what `make mutation`'s runner (which waits for any child) trips on."""
    started: list[subprocess.Popen[bytes]] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    yield started
    for holder in started:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=60)


def test_run_starts_the_command_with_the_held_copy_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holders: list[subprocess.Popen[bytes]]
) -> None:
    """`run NAME -- COMMAND` in this process, up to the exec: the holder (this program again, as the
    cache's owner) has staged and holds the copy when the command starts; the command, less the `--`,
    gets GPUPLAT_DATASET_PATH beside the caller's environment and inherits the holder's pipe, whose EOF
    lets the copy go."""
    cache = load_script_quietly()
    config = _setup(tmp_path)
    started: dict[str, Any] = {}

    def execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
        copy = Path(env["GPUPLAT_DATASET_PATH"])
        assert holders[0].stdin is not None
        started.update(
            file=file,
            args=args,
            env=env,
            held=_is_held(copy),
            inherits=os.get_inheritable(holders[0].stdin.fileno()),
        )
        raise _Started

    monkeypatch.setattr(sys, "argv", [str(PROGRAM)])
    monkeypatch.setattr(os, "execvpe", execvpe)
    monkeypatch.setenv("GPUPLAT_TEST_CALLER", "kept")
    with pytest.raises(_Started):
        cache.main(["--config", str(config), "run", "corpus", "--", "job", "--flag", "--"])
    copy = tmp_path / "cache" / "corpus" / "v1" / "g1"
    assert (started["file"], started["args"]) == ("job", ["job", "--flag", "--"])
    assert (
        started["env"]["GPUPLAT_DATASET_PATH"] == str(copy)
        and started["env"]["GPUPLAT_TEST_CALLER"] == "kept"
    )
    assert started["held"] is True and started["inherits"] is True
    (holder,) = holders
    assert holder.stdout is not None and holder.stdout.closed  # the caller reads no more of the holder
    assert holder.stdin is not None
    holder.stdin.close()  # the command and all that inherited the pipe have ended
    assert holder.wait(timeout=60) == 0
    assert not _is_held(copy)


def test_run_without_a_command_or_a_holder_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holders: list[subprocess.Popen[bytes]]
) -> None:
    """`run` refuses no command; a holder that fails passes its exit status on (its error is its own
    stderr line); one that cannot start, or ends without holding, is one line naming how it was started;
    an exit mark of 0 without a held copy is still a failure; a command that cannot start is one line."""
    cache = load_script_quietly()
    config = _setup(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(PROGRAM)])
    missing_program = str(tmp_path / "no-such-program")
    execvpe = os.execvpe

    def started_only_if_missing(file: str, args: list[str], env: dict[str, str]) -> None:
        if file == missing_program:
            execvpe(file, args, env)  # raises: there is no such program
        raise _Started  # none of these may start their command (nor replace this process)

    monkeypatch.setattr(os, "execvpe", started_only_if_missing)
    for command in ([], ["--"]):
        refused = _main(config, "run", "corpus", *command)
        _one_error_line(refused)
        assert refused.stderr.splitlines()[-1] == "gpuplat-dataset: run: give the command after `--`"
    assert _main(config, "run", "imagenet", "--", "true").returncode == 2  # the holder's own refusal
    missing = _main(config, "run", "corpus", "--", missing_program)
    _one_error_line(missing, f"run: cannot start {tmp_path / 'no-such-program'}: No such file or directory")

    owner = cache.cache_owner(cache.load_config(config))[0]
    monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)  # not the owner: through GPUPLAT_DATASET_BECOME
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", str(tmp_path / "no-sudo"))
    _one_error_line(
        _main(config, "run", "corpus", "--", "true"),
        f"cannot run as the cache owner through `{tmp_path / 'no-sudo'}` ([Errno 2] No such file",
    )
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", "true")
    _one_error_line(
        _main(config, "run", "corpus", "--", "true"),
        "cannot run as the cache owner through `true` (exit 0, see above;",
    )
    monkeypatch.setenv("GPUPLAT_DATASET_BECOME", f"printf '%s\\n' {cache.EXIT_MARK}0")
    assert _main(config, "run", "corpus", "--", "true").returncode == 2


def test_an_os_error_names_the_dataset_and_version_when_the_configuration_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError is one line: the dataset and its version when the configuration names them, the error
    and its file, and that the disk is full when it is; a command without a dataset (list), or a
    configuration that no longer reads, names none."""
    cache = load_script_quietly()
    config = _setup(tmp_path)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/cache/corpus/v1/.staging-1/index.json")

    monkeypatch.setattr(cache, "stage", full)
    done = _main_of(cache, config, "stage", "corpus")
    assert (done.returncode, done.stderr) == (
        2,
        "gpuplat-dataset: corpus v1: No space left on device: /cache/corpus/v1/.staging-1/index.json "
        "(the cache's disk is full)\n",
    )

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cache, "list_datasets", denied)
    assert _main_of(cache, config, "list").stderr == "gpuplat-dataset: Permission denied\n"
    monkeypatch.setattr(cache, "stage", denied)
    assert (
        _main_of(cache, config, "stage", "imagenet").stderr == "gpuplat-dataset: imagenet Permission denied\n"
    )
    args = cache.parse(["--config", str(tmp_path / "gone.json"), "stage", "corpus"])
    assert cache.describe_version(args) == ""


def test_root_becomes_the_cache_owner_groups_first_then_group_then_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root (a job's prolog, an admin) stages as the cache's owner, so that what it writes is the owner's
    to remove later: no supplementary groups, the owner's group, then the owner's uid (after setuid it
    could no longer change its groups). The switch is recorded here, not made."""
    cache = load_script_quietly()
    config = _setup(tmp_path)
    (tmp_path / "cache").mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(tmp_path / "cache", CACHE_UID, CACHE_UID)
    owner = (tmp_path / "cache").stat()
    switched: list[tuple[str, object]] = []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for call in ("setgroups", "setgid", "setuid"):
        monkeypatch.setattr(os, call, lambda value, call=call: switched.append((call, value)))
    done = _main_of(cache, config, "stage", "corpus")
    assert done.returncode == 0, done.stderr
    assert switched == [("setgroups", []), ("setgid", owner.st_gid), ("setuid", owner.st_uid)]
