#!/usr/bin/env python3
"""gpuplat-dataset: the node's cache of the stack's datasets on local NVMe.

    gpuplat-dataset stage NAME [--check size|full]   make sure an intact copy of the dataset's version is
                                   cached (copy it when it is not) and print its directory
    gpuplat-dataset run NAME [--check size|full] -- COMMAND...   stage, then run COMMAND with
                                   GPUPLAT_DATASET_PATH set, holding the copy for as long as it runs
    gpuplat-dataset verify NAME [--check full|size]   check the cached copy against its manifest; a copy
                                   that fails is withdrawn (exit 1) and the next stage copies it again
    gpuplat-dataset list           the datasets, their versions and whether each is cached

The datasets come from /etc/gpuplat/datasets.json (written by roles/slurm_compute from the stack's
`datasets:`): name, version, and the source directory on the shared filesystem (on AWS the FSx data
repository association shows the datasets bucket there); `cache_path`, `cache_user` and
`cache_max_bytes`.

Who writes: the cache belongs to its own system user (gpuplat-cache, whoever owns `cache_path`);
directories are 0755 and files 0444, so one user's job cannot change what another's reads. `stage` and
`verify` run by anyone else run again as that user, through `sudo -n -u gpuplat-cache` (the role's
sudoers drop-in allows exactly this program; GPUPLAT_DATASET_BECOME replaces the command, for tests);
root drops to that user itself. Under sudo only /etc/gpuplat/datasets.json is read. The cache copies only
datasets every user may read (it serves every user of the node).

Layout, per dataset and version: `<cache>/<name>/<version>/gN/` are complete copies (generations),
`current` a symlink to the one handed out, `.lock` the stagers' lock. A copy is written under
`.staging-<pid>/`, each file hashed (SHA-256) as it is read from the source and checked again once
written; then its manifest and STAGED.json (the manifest's digest, the source, the bytes) are written,
everything is fsynced, the directory is renamed to the next gN and `current` is switched to it by a
rename. A copy is never rewritten or removed in place: a copy found bad is replaced by a new generation.

Readers: a job holds a shared flock on its generation's directory for as long as it reads (`run` does
it for the command it starts; the descriptor is inherited). A generation is removed only after an
exclusive flock on it succeeds without waiting (no job holds it): older generations, versions no longer
in the stack, and, to keep the cache under `cache_max_bytes` and the disk's free space, the least
recently used copies (`stage` stamps each use). A stage that cannot make room without removing a copy
in use is refused before it copies anything.

Checks: at a job start (`--check size`, the default of stage and run) the manifest against its digest
and every file's size: no file is read. A full hash (`--check full`, the default of verify) reads every
byte; staging always does. Whatever a kill between two steps leaves (a staging directory, a generation
`current` does not name, a half-removed one) is never handed out and is removed by the next stage.

Errors are one line on stderr starting with `gpuplat-dataset:`, exit 2.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

CONFIG = Path("/etc/gpuplat/datasets.json")
MANIFEST = "MANIFEST.json"
STAGED = "STAGED.json"
LOCK = ".lock"
CURRENT = "current"
STAGING = ".staging-"
TRASH = ".trash-"
NEW_CURRENT = ".current-"
LAST_GENERATION = ".generation"
# <version>/.readers-gN: the jobs reading gN hold shared flocks on it; the cache's owner's alone (0600),
# so no user can take it exclusively and block other users' jobs (a flock needs only an open file).
READERS = ".readers-"
GENERATION = re.compile(r"^g(\d+)$")
COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
CHUNK = 8 * 1024 * 1024
BECOME_ENV = "GPUPLAT_DATASET_BECOME"
DEFAULT_BECOME = "sudo -n -u {user} --"
# Left free on the cache's disk beside the copies (filesystem metadata, other writers).
DISK_MARGIN = 64 * 1024 * 1024
# An escalated run's last line on stdout: tells its caller the program ran (and not sudo refusing).
EXIT_MARK = "gpuplat-dataset-exit="
# What `hold` (the owner's side of `run`) prints once it holds the copy; it then waits for EOF on stdin.
HELD_MARK = "gpuplat-dataset-held="


class CacheError(Exception):
    """A problem the caller must fix (unknown dataset, missing source, no room); exit 2."""


# --- configuration ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    name: str
    version: str
    source: Path


@dataclass(frozen=True)
class Config:
    path: Path
    cache: Path
    user: str | None
    max_bytes: int
    datasets: tuple[Dataset, ...]

    def dataset(self, name: str) -> Dataset:
        for entry in self.datasets:
            if entry.name == name:
                return entry
        known = ", ".join(e.name for e in self.datasets) or "none"
        raise CacheError(f"no dataset {name!r} in the stack (known: {known})")

    def version_dir(self, entry: Dataset) -> Path:
        return self.cache / entry.name / entry.version


def load_config(path: Path) -> Config:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheError(f"{path}: cannot read the dataset configuration ({exc})") from exc

    def bad(what: str) -> CacheError:
        return CacheError(f"{path}: {what} (roles/slurm_compute writes this file)")

    if not isinstance(document, dict):
        raise bad("not a JSON object")
    cache = document.get("cache_path")
    if not isinstance(cache, str) or not cache.startswith("/"):
        raise bad("cache_path must be an absolute path")
    user = document.get("cache_user")
    if user is not None and (not isinstance(user, str) or not re.fullmatch(r"[a-z_][a-z0-9_-]*", user)):
        raise bad("cache_user must be a user name")
    max_bytes = document.get("cache_max_bytes", 0)
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise bad("cache_max_bytes must be a whole number of bytes (0: no cap)")
    entries = document.get("datasets", [])
    datasets: list[Dataset] = []
    for index, entry in enumerate(entries if isinstance(entries, list) else [None]):
        fields = entry if isinstance(entry, dict) else {}
        name, version, source = fields.get("name"), fields.get("version"), fields.get("source")
        if not all(isinstance(v, str) for v in (name, version, source)):
            raise bad(f"datasets[{index}] needs name, version and source")
        assert isinstance(name, str) and isinstance(version, str) and isinstance(source, str)
        if not COMPONENT.match(name) or not COMPONENT.match(version) or not source.startswith("/"):
            raise bad(f"datasets[{index}]: name and version are [A-Za-z0-9._-], source an absolute path")
        datasets.append(Dataset(name, version, Path(source)))
    return Config(path, Path(cache), user, max_bytes, tuple(datasets))


# --- who runs it ----------------------------------------------------------------------------------------


def cache_owner(config: Config) -> tuple[int, int]:
    """(uid, gid) the cache belongs to: its root's owner, which must be cache_user when the configuration
    names one. A root others may write to is refused."""
    try:
        status = config.cache.stat()
    except FileNotFoundError:
        if config.user is not None:  # a node: the role makes it, the cache user's (not whoever comes first)
            raise CacheError(
                f"{config.cache} does not exist: roles/slurm_compute makes it, {config.user}'s"
            ) from None
        # No cache yet on a developer's machine: whoever stages first owns it.
        config.cache.mkdir(mode=0o755, parents=True, exist_ok=True)
        status = config.cache.stat()
    if not stat.S_ISDIR(status.st_mode):
        raise CacheError(f"{config.cache} is not a directory")
    if config.user is not None:
        try:
            owner = pwd.getpwuid(status.st_uid).pw_name
        except KeyError:
            owner = f"uid {status.st_uid}"
        if owner != config.user:
            raise CacheError(
                f"{config.cache} belongs to {owner}, not to the cache user {config.user}: whoever owns it "
                "could change what every job reads; roles/slurm_compute makes it the cache user's"
            )
    if status.st_mode & 0o022:
        raise CacheError(
            f"{config.cache} may be written by other users (mode {stat.S_IMODE(status.st_mode):o}): any of "
            "them could replace what jobs read; roles/slurm_compute makes it the cache user's, 0755"
        )
    return status.st_uid, status.st_gid


def drop_to(uid: int, gid: int) -> None:
    """Root becomes the cache's owner for good (what it writes must be the owner's to remove later)."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def become_command(config: Config, uid: int) -> list[str]:
    template = os.environ.get(BECOME_ENV) or DEFAULT_BECOME
    user = config.user or f"#{uid}"
    return [part.replace("{user}", user) for part in shlex.split(template)]


def owner_command(config: Config, arguments: Sequence[str]) -> tuple[list[str], str]:
    """This program again, as the cache's owner, with `arguments`; and how it becomes the owner."""
    uid, _ = cache_owner(config)
    program = os.path.realpath(sys.argv[0])
    # Root and the owner run it directly (root's drops to the owner itself); anyone else through sudo
    # (or GPUPLAT_DATASET_BECOME).
    direct = os.geteuid() in (0, uid)
    command = [sys.executable, program] if direct else [*become_command(config, uid), program]
    how = shlex.join(command[:-1])
    if config.path != CONFIG:
        command += ["--config", str(config.path)]
    return [*command, "--as-owner", *arguments], how


def cannot_become(how: str, detail: str) -> CacheError:
    return CacheError(
        f"cannot run as the cache owner through `{how}` ({detail}; roles/slurm_compute installs the sudoers "
        "rule for /usr/local/bin/gpuplat-dataset)"
    )


def as_owner(config: Config, arguments: Sequence[str]) -> tuple[int, str]:
    """Run this program again as the cache's owner with `arguments`; stderr passes through. Returns its
    exit status and its stdout (less the exit mark)."""
    command, how = owner_command(config, arguments)
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    except OSError as exc:
        raise cannot_become(how, str(exc)) from exc
    lines = done.stdout.splitlines()
    if not lines or not lines[-1].startswith(EXIT_MARK):
        raise cannot_become(how, f"exit {done.returncode}, see above")
    return int(lines[-1].removeprefix(EXIT_MARK)), "".join(f"{line}\n" for line in lines[:-1])


# --- locks ----------------------------------------------------------------------------------------------


class Lock:
    """An flock on a file or directory, released on close (a killed holder releases it too)."""

    def __init__(self, path: Path, mode: int, create: bool = False) -> None:
        flags = os.O_RDONLY | os.O_CLOEXEC
        if create:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self.fd = os.open(path, flags, 0o600)
        try:
            fcntl.flock(self.fd, mode)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def try_exclusive(path: Path) -> Lock | None:
    """The exclusive lock of a generation or version, when no one holds it; None otherwise."""
    try:
        return Lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    except FileNotFoundError:
        return None


def readers(generation: Path) -> Path:
    return generation.parent / f"{READERS}{generation.name}"


def hold_current(version: Path) -> tuple[Path, Lock] | None:
    """The generation `current` names, with a shared lock on its readers' file; None when there is none.
    A generation is removed under the exclusive lock, renamed away and its readers' file unlinked: once
    locked, both must still be in place (else `current` moved on meanwhile: read it again)."""
    seen = None
    while True:
        try:
            target = os.readlink(version / CURRENT)
        except OSError:
            return None
        if not GENERATION.match(target) or target == seen:
            return None
        seen = target
        path = version / target
        held = hold(path)
        if held is not None:
            return path, held


def hold(path: Path) -> Lock | None:
    """A shared lock on a generation that is still in place (the cache's owner only)."""
    try:
        lock = Lock(readers(path), fcntl.LOCK_SH)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        now = os.stat(readers(path))
        directory = os.lstat(path)
    except FileNotFoundError:
        lock.close()
        return None
    locked = os.fstat(lock.fd)
    if (now.st_dev, now.st_ino) != (locked.st_dev, locked.st_ino) or not stat.S_ISDIR(directory.st_mode):
        lock.close()
        return None
    return lock


# --- copies and checks ----------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def source_files(source: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every file, in order; only regular files and directories every user may
    read (the cache serves every user of the node)."""
    found: list[tuple[str, int]] = []

    def check(path: Path, status: os.stat_result, need: int) -> None:
        if stat.S_IMODE(status.st_mode) & need != need:
            raise CacheError(
                f"{path} is not readable by every user (mode {stat.S_IMODE(status.st_mode):o}): the cache "
                "serves every user of the node; make the dataset world-readable or read it in place"
            )

    def walk(directory: Path) -> Iterator[Path]:
        with os.scandir(directory) as entries:
            ordered = sorted(entries, key=lambda e: e.name)
        for entry in ordered:
            path = Path(entry.path)
            status = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(status.st_mode):
                check(path, status, 0o005)
                yield from walk(path)
            elif stat.S_ISREG(status.st_mode):
                check(path, status, 0o004)
                found.append((str(path.relative_to(source)), status.st_size))
                yield path
            else:
                raise CacheError(f"{path}: only regular files and directories are cached (a link or device)")

    check(source, source.stat(), 0o005)
    for _ in walk(source):
        pass
    return found


def copy_hashed(source: Path, target: Path) -> dict[str, Any]:
    """Copy one file, hashing the bytes as they are read; fsync the copy; read-only."""
    digest = hashlib.sha256()
    size = 0
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with source.open("rb") as reader, target.open("xb") as writer:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    target.chmod(0o444)
    return {"size": size, "sha256": digest.hexdigest()}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as reader:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def staged_record(directory: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((directory / STAGED).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def problems(directory: Path, entry: Dataset, check: str) -> list[str]:
    """Why the copy cannot be handed out (empty: it can). `size`: the manifest against its recorded
    digest, the source it came from, each file's size; `full`: each file's SHA-256 too."""
    record = staged_record(directory)
    try:
        raw = (directory / MANIFEST).read_bytes()
    except OSError:
        raw = None
    if record is None or raw is None:
        return ["no complete manifest"]
    if hashlib.sha256(raw).hexdigest() != record.get("manifest_sha256"):
        return ["the manifest digest differs from the one recorded when it was staged"]
    try:
        manifest = json.loads(raw)
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError):
        return ["no complete manifest"]
    if manifest.get("version") != entry.version or manifest.get("source") != str(entry.source):
        return [f"staged from another source ({manifest.get('source')} {manifest.get('version')})"]
    found: list[str] = []
    for relative, expected in sorted(files.items()):
        path = directory / relative
        try:
            status = path.lstat()
        except OSError:
            found.append(f"{relative}: missing")
            continue
        if not stat.S_ISREG(status.st_mode):
            found.append(f"{relative}: not a regular file")
        elif status.st_size != expected["size"]:
            found.append(f"{relative}: {status.st_size} bytes, expected {expected['size']}")
        elif check == "full" and file_sha256(path) != expected["sha256"]:
            found.append(f"{relative}: content differs from the source (SHA-256)")
    return found


# --- generations and room -------------------------------------------------------------------------------


def generations(version: Path) -> list[tuple[int, Path]]:
    found = []
    try:
        listing = list(os.scandir(version))
    except FileNotFoundError:
        return []
    for entry in listing:
        match = GENERATION.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def next_generation(version: Path) -> int:
    """Never a number used before in this version (a path a job was given names one copy only)."""
    counter = version / LAST_GENERATION
    try:
        last = int(counter.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = 0
    number = max([last, *(n for n, _ in generations(version))]) + 1
    counter.write_text(f"{number}\n", encoding="utf-8")
    return number


def current_name(version: Path) -> str | None:
    try:
        return os.readlink(version / CURRENT)
    except OSError:
        return None


def remove_generation(version: Path, generation: Path) -> bool:
    """Remove a generation no job holds (False: one does, it stays). Held by the caller: the version's
    lock. Under the exclusive lock of its readers' file (taken without waiting): `current` unlinked when
    it names it, the directory renamed away, the readers' file unlinked; then the files are removed."""
    try:
        lock = Lock(readers(generation), fcntl.LOCK_EX | fcntl.LOCK_NB, create=True)
    except BlockingIOError:
        return False
    trash = version / f"{TRASH}{generation.name}-{os.getpid()}"
    with lock:
        if current_name(version) == generation.name:
            (version / CURRENT).unlink()
        generation.rename(trash)
        readers(generation).unlink()
        fsync_dir(version)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def clean_version(version: Path, keep_current: bool = True) -> None:
    """Under the version's lock: leftovers of killed runs, and generations no longer current that no
    job holds."""
    with os.scandir(version) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        path = version / name
        if name.startswith((STAGING, TRASH)):
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(NEW_CURRENT):
            path.unlink(missing_ok=True)
        elif name.startswith(READERS) and not (version / name.removeprefix(READERS)).is_dir():
            orphan = try_exclusive(path)  # a stage killed between making it and the rename
            if orphan is not None:
                with orphan:
                    path.unlink(missing_ok=True)
    current = current_name(version) if keep_current else None
    for _, generation in generations(version):
        if generation.name != current:
            remove_generation(version, generation)


def cache_versions(config: Config) -> Iterator[tuple[str, str, Path]]:
    if not config.cache.is_dir():
        return
    for dataset_dir in sorted(config.cache.iterdir()):
        if dataset_dir.is_dir() and not dataset_dir.is_symlink() and COMPONENT.match(dataset_dir.name):
            for version in sorted(dataset_dir.iterdir()):
                if version.is_dir() and not version.is_symlink() and COMPONENT.match(version.name):
                    yield dataset_dir.name, version.name, version


def generation_bytes(generation: Path) -> int:
    record = staged_record(generation)
    if record is not None and isinstance(record.get("bytes"), int):
        return int(record["bytes"])
    return sum(p.stat().st_size for p in generation.rglob("*") if p.is_file() and not p.is_symlink())


def staging_bytes(version: Path) -> int:
    total = 0
    for staging in version.glob(f"{STAGING}*"):
        try:
            total += int((staging / ".reserved").read_text())
        except (OSError, ValueError):
            continue
    return total


def make_room(config: Config, entry: Dataset, needed: int, log: TextIO) -> None:
    """Under the cache's lock: evict the least recently used copies no job holds until `needed` more
    bytes fit under cache_max_bytes and the disk's free space. Refused, nothing removed that must stay,
    when they cannot. `entry`'s own current copy goes first: a stage copies only where it has none or
    the one it has failed its check (stage_copy), so that copy is being replaced."""
    configured = {(d.name, d.version) for d in config.datasets}
    copies: list[tuple[float, str, str, Path, Path, int]] = []  # last use, name, version, dirs, bytes
    used = 0
    for name, version_name, version in cache_versions(config):
        used += staging_bytes(version)
        for _, generation in generations(version):
            try:  # another stage may be removing it meanwhile (under that version's lock)
                size = generation_bytes(generation)
                last_use = generation.stat().st_mtime
            except FileNotFoundError:
                continue
            used += size
            copies.append((last_use, name, version_name, version, generation, size))
    free = shutil.disk_usage(config.cache).free
    limit = used + free - DISK_MARGIN
    if config.max_bytes:
        limit = min(limit, config.max_bytes)
    replaced = (config.version_dir(entry), current_name(config.version_dir(entry)))
    # The copy being replaced first, then versions no longer in the stack, then the least recently used.
    copies.sort(key=lambda c: ((c[3], c[4].name) != replaced, (c[1], c[2]) in configured, c[0]))
    in_use = 0
    for _, name, version_name, version, generation, size in copies:
        if used + needed <= limit:
            break
        # The version's lock: held by this stage for its own version, else taken without waiting.
        lock = None if version == config.version_dir(entry) else try_exclusive(version / LOCK)
        if lock is None and version != config.version_dir(entry):
            in_use += size  # its stager is at work
            continue
        try:
            if remove_generation(version, generation):
                used -= size
                print(f"{entry.name} {entry.version}: evicted {name} {version_name} ({size} bytes)", file=log)
            else:
                in_use += size
        finally:
            if lock is not None:
                lock.close()
    if used + needed > limit:
        cap = f"cache_max_bytes {config.max_bytes}" if config.max_bytes else "no cache_max_bytes"
        raise CacheError(
            f"{entry.name} {entry.version}: no room for {needed} bytes in {config.cache} ({cap}, "
            f"{free} bytes free on its disk, {used} bytes cached of which {in_use} in use by running "
            "jobs): raise the cap or free the disk, or wait for those jobs"
        )


# --- staging --------------------------------------------------------------------------------------------


def stage_copy(config: Config, entry: Dataset, version: Path, log: TextIO) -> Path:
    """Copy the source into a new generation and make it current. Held: the version's lock."""
    files = source_files(entry.source)
    needed = sum(size for _, size in files)
    staging = version / f"{STAGING}{os.getpid()}"
    with Lock(config.cache / LOCK, fcntl.LOCK_EX, create=True):
        make_room(config, entry, needed, log)
        staging.mkdir(mode=0o755)
        (staging / ".reserved").write_text(str(needed), encoding="utf-8")
    try:
        copied = {relative: copy_hashed(entry.source / relative, staging / relative) for relative, _ in files}
        manifest = {"version": entry.version, "source": str(entry.source), "files": copied}
        raw = json.dumps(manifest, indent=1, sort_keys=True).encode()
        record = {
            "manifest_sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": sum(f["size"] for f in copied.values()),
            "files": len(copied),
            "staged_at": time.time(),
        }
        for name, content in ((MANIFEST, raw), (STAGED, json.dumps(record, sort_keys=True).encode())):
            with (staging / name).open("xb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            (staging / name).chmod(0o444)
        written = problems(staging, entry, "full")
        if written:
            raise CacheError(f"the copy does not match what was read: {'; '.join(written)}")
        (staging / ".reserved").unlink()
        for directory in sorted({p for p in staging.rglob("*") if p.is_dir()}, reverse=True):
            fsync_dir(directory)
        fsync_dir(staging)
        final = version / f"g{next_generation(version)}"
        Lock(readers(final), fcntl.LOCK_SH, create=True).close()
        staging.rename(final)
        link = version / f"{NEW_CURRENT}{os.getpid()}"
        link.unlink(missing_ok=True)
        link.symlink_to(final.name)
        link.rename(version / CURRENT)
        fsync_dir(version)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def stage(config: Config, name: str, check: str, log: TextIO = sys.stderr) -> Path:
    """The path of an intact copy; copied when there is none. A job start costs a shared lock and the
    cheap check; the version's lock is taken to copy, and without waiting to tidy up."""
    entry = config.dataset(name)
    label = f"{entry.name} {entry.version}"
    if not entry.source.is_dir():
        raise CacheError(f"dataset {label}: source {entry.source} is not a directory")
    version = config.version_dir(entry)
    version.mkdir(mode=0o755, parents=True, exist_ok=True)
    path, reason = usable(version, entry, check)
    if path is not None:
        print(f"{label}: cached at {path}", file=log)
        tidy = try_exclusive(version / LOCK)
        if tidy is not None:
            with tidy:
                clean_version(version)
        remove_unconfigured(config)
        return path
    with Lock(version / LOCK, fcntl.LOCK_EX, create=True):
        path, reason = usable(version, entry, check)  # another job may have staged it meanwhile
        if path is not None:
            print(f"{label}: cached at {path}", file=log)
        else:
            if reason:
                print(f"{label}: cached copy unusable ({reason}); staging again", file=log)
            clean_version(version)
            path = stage_copy(config, entry, version, log)
            print(f"{label}: staged from {entry.source} to {path}", file=log)
        clean_version(version)
    remove_unconfigured(config)
    return path


def usable(version: Path, entry: Dataset, check: str) -> tuple[Path | None, str]:
    """The current copy when it passes the check (its use stamped), else None and why."""
    held = hold_current(version)
    if held is None:
        return None, ""
    path, lock = held
    with lock:
        found = problems(path, entry, check)
        if found:
            return None, "; ".join(found)
        os.utime(path)  # the least recently used is evicted first
        return path, ""


def remove_unconfigured(config: Config) -> None:
    """Versions the stack no longer lists: removed once no job holds them."""
    configured = {(d.name, d.version) for d in config.datasets}
    for name, version_name, version in list(cache_versions(config)):
        if (name, version_name) in configured:
            continue
        lock = try_exclusive(version / LOCK)
        if lock is None:
            continue
        with lock:
            clean_version(version, keep_current=False)


def verify(config: Config, name: str, check: str, out: TextIO = sys.stdout) -> int:
    """Check the current copy; withdraw it when it fails (the next stage copies again)."""
    entry = config.dataset(name)
    label = f"{entry.name} {entry.version}"
    version = config.version_dir(entry)
    held = hold_current(version) if version.is_dir() else None
    if held is None:
        print(f"{label}: not cached", file=out)
        print(f"gpuplat-dataset: {label}: not cached", file=sys.stderr)
        return 1
    path, lock = held
    with lock:
        found = problems(path, entry, check)
    for problem in found:
        print(f"{label}: {problem}", file=out)
    if not found:
        return 0
    with Lock(version / LOCK, fcntl.LOCK_EX, create=True):
        if current_name(version) == path.name:
            (version / CURRENT).unlink()
            fsync_dir(version)
        clean_version(version)
    print(
        f"gpuplat-dataset: {label}: {path} failed the check and is withdrawn; the next stage copies it "
        "again (jobs reading it keep it until they end)",
        file=sys.stderr,
    )
    return 1


def run(config: Config, args: argparse.Namespace) -> int:
    """Stage through a holder (this program as the cache's owner, `hold`), which holds the copy until
    the command ends; exec the command with GPUPLAT_DATASET_PATH set."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CacheError("run: give the command after `--`")
    holder, how = owner_command(config, ["hold", args.name, "--check", args.check])
    try:
        process = subprocess.Popen(holder, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    except OSError as exc:
        raise cannot_become(how, str(exc)) from exc
    assert process.stdin is not None and process.stdout is not None
    path = None
    for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith(HELD_MARK):
            path = line.removeprefix(HELD_MARK)
            break
        if line.startswith(EXIT_MARK):
            raise SystemExit(int(line.removeprefix(EXIT_MARK)) or 2)  # its error is on stderr
    if path is None:
        raise cannot_become(how, f"exit {process.wait()}, see above")
    process.stdout.close()
    # The holder keeps the copy until EOF on its stdin: when the command, and every process that
    # inherited this descriptor, has ended.
    os.set_inheritable(process.stdin.fileno(), True)
    environment = {**os.environ, "GPUPLAT_DATASET_PATH": path}
    try:
        os.execvpe(command[0], command, environment)
    except OSError as exc:
        raise CacheError(f"run: cannot start {command[0]}: {exc.strerror}") from exc


def hold_for_caller(config: Config, name: str, check: str) -> int:
    """`run`'s owner side: stage, hold a shared lock on the copy, print where it is, and keep the lock
    until EOF on stdin. SIGTERM and SIGINT are ignored: a job given a grace time to save may still
    read; the holder ends with the job's processes (EOF), or with SIGKILL when Slurm ends the step."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for _ in range(5):
        path = stage(config, name, check)
        lock = hold(path)
        if lock is not None:
            break
    else:
        raise CacheError(f"{name}: the copy was removed each time before it could be held")
    with lock:
        print(f"{HELD_MARK}{path}", flush=True)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the caller reads no more (and execs its command)
        os.close(devnull)
        while os.read(0, 65536):
            pass
    return 0


# --- the command line -----------------------------------------------------------------------------------


def list_datasets(config: Config) -> None:
    for entry in config.datasets:
        version = config.version_dir(entry)
        name = current_name(version) if version.is_dir() else None
        cached = name is not None and GENERATION.match(name) and (version / name / STAGED).is_file()
        print(f"{entry.name}\t{entry.version}\t{'cached' if cached else '-'}\t{entry.source}")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuplat-dataset", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--as-owner", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command_name", required=True)
    for command, default in (("stage", "size"), ("verify", "full"), ("run", "size"), ("hold", "size")):
        sub = commands.add_parser(command)
        sub.add_argument("name")
        sub.add_argument("--check", choices=("full", "size"), default=default)
        if command == "run":
            sub.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    commands.add_parser("list")
    return parser.parse_args(argv)


def dispatch(args: argparse.Namespace) -> int:
    if "SUDO_UID" in os.environ and os.getuid() != 0:
        # What sudo lets every user run as the cache's user: never a command of theirs, never a
        # configuration of theirs (their own files as the source of a stack's dataset).
        if args.command_name == "run":
            raise CacheError("under sudo, run is refused (it would start a command as the cache's user)")
        if args.config != CONFIG:
            raise CacheError(f"under sudo only {CONFIG} is read, not {args.config}")
    config = load_config(args.config)
    if args.command_name == "list":
        list_datasets(config)
        return 0
    if args.command_name == "run":
        return run(config, args)
    if args.command_name == "hold" and not args.as_owner:
        raise CacheError("hold is what `run` starts as the cache's owner; use run")
    uid, gid = cache_owner(config)
    if os.geteuid() != uid:
        if os.geteuid() == 0:
            drop_to(uid, gid)
        elif args.as_owner:
            raise CacheError(f"ran as uid {os.geteuid()}, but {config.cache} belongs to uid {uid}")
        else:
            code, out = as_owner(config, [args.command_name, args.name, "--check", args.check])
            sys.stdout.write(out)
            return code
    os.umask(0o022)
    if args.command_name == "stage":
        print(stage(config, args.name, args.check))
        return 0
    if args.command_name == "hold":
        return hold_for_caller(config, args.name, args.check)
    return verify(config, args.name, args.check)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        code = dispatch(args)
    except CacheError as exc:
        print(f"gpuplat-dataset: {exc}", file=sys.stderr)
        code = 2
    except OSError as exc:
        what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        if exc.errno == errno.ENOSPC:
            what = f"{what} (the cache's disk is full)"
        name = f"{args.name} " if getattr(args, "name", None) else ""
        print(f"gpuplat-dataset: {name}{describe_version(args)}{what}", file=sys.stderr)
        code = 2
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        print("gpuplat-dataset: interrupted", file=sys.stderr)
        code = 2
    if args.as_owner and not (args.command_name == "hold" and code == 0):
        print(f"{EXIT_MARK}{code}", flush=True)
    return code


def describe_version(args: argparse.Namespace) -> str:
    try:
        return f"{load_config(args.config).dataset(args.name).version}: "
    except (CacheError, AttributeError):
        return ""


if __name__ == "__main__":
    sys.exit(main())
