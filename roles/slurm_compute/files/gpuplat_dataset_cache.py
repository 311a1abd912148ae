#!/usr/bin/env python3
"""gpuplat-dataset: the node's cache of the stack's datasets on local NVMe.

    gpuplat-dataset stage NAME     copy the dataset's version to the cache unless it is there and intact;
                                   print its local path (jobs read from there)
    gpuplat-dataset verify NAME    check the cached copy against its manifest (exit 1 when it is not)
    gpuplat-dataset list           the datasets, their versions and whether each is cached

The datasets come from /etc/gpuplat/datasets.json (written by roles/slurm_compute from the stack's
`datasets:`): name, version, and the source directory on the shared filesystem (on AWS the FSx data
repository association shows the datasets bucket there).

A version is staged once per node and shared by every job on it: jobs that start together wait on one
lock, and the first copies. A copy goes to a staging directory, each file hashed (SHA-256) as it is read
from the source and checked again once written; only then is the manifest written and the directory
renamed into place. A directory without its manifest (a node lost mid-copy) is never read and is removed
by the next stage. Before a cached copy is handed out it is checked against its manifest (`--check
full`, the default, hashes every file; `--check size` only compares sizes); a copy that fails is
restaged, never read.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

CONFIG = Path("/etc/gpuplat/datasets.json")
MANIFEST = "MANIFEST.json"
STAGING = ".staging-"
CHUNK = 8 * 1024 * 1024


class CacheError(Exception):
    """A problem the caller must fix (unknown dataset, missing source); exit 2."""


def load_config(path: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CacheError(f"{path}: cannot read the dataset configuration ({exc})") from exc
    return config


def dataset(config: dict[str, Any], name: str) -> dict[str, str]:
    for entry in config.get("datasets", []):
        if entry["name"] == name:
            return dict(entry)
    known = ", ".join(e["name"] for e in config.get("datasets", [])) or "none"
    raise CacheError(f"no dataset {name!r} in the stack (known: {known})")


def source_files(source: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            yield Path(root, name)


def copy_hashed(source: Path, target: Path) -> dict[str, Any]:
    """Copy one file, hashing the bytes as they are read; fsync the copy."""
    digest = hashlib.sha256()
    size = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as reader, target.open("wb") as writer:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return {"size": size, "sha256": digest.hexdigest()}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as reader:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def problems(directory: Path, check: str) -> list[str]:
    """Why the cached copy cannot be used (empty: it can)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return ["no complete manifest"]
    found: list[str] = []
    for relative, expected in sorted(manifest["files"].items()):
        path = directory / relative
        if not path.is_file():
            found.append(f"{relative}: missing")
        elif path.stat().st_size != expected["size"]:
            found.append(f"{relative}: {path.stat().st_size} bytes, expected {expected['size']}")
        elif check == "full" and file_sha256(path) != expected["sha256"]:
            found.append(f"{relative}: content differs from the source (SHA-256)")
    return found


def stage_copy(source: Path, cache: Path, version: str) -> Path:
    staging = cache / f"{STAGING}{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    files = {
        str(path.relative_to(source)): copy_hashed(path, staging / path.relative_to(source))
        for path in source_files(source)
    }
    manifest = {"version": version, "source": str(source), "files": files}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    written = problems(staging, "full")
    if written:
        shutil.rmtree(staging, ignore_errors=True)
        raise OSError(f"the copy in {staging} does not match what was read: {'; '.join(written)}")
    final = cache / version
    staging.replace(final)
    dir_fd = os.open(cache, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def stage(config: dict[str, Any], name: str, check: str, log: TextIO | None = None) -> Path:
    """The cached copy's path, staged first where it is missing or unusable; what happened goes to `log`
    (standard error as it is when called, not as it was at import)."""
    log = sys.stderr if log is None else log
    entry = dataset(config, name)
    source = Path(entry["source"])
    if not source.is_dir():
        raise CacheError(f"dataset {name} version {entry['version']}: source {source} is not a directory")
    cache = Path(config["cache_path"]) / name
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for leftover in cache.glob(f"{STAGING}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        final = cache / entry["version"]
        if final.exists():
            found = problems(final, check)
            if not found:
                print(f"{name} {entry['version']}: cached at {final}", file=log)
                return final
            print(
                f"{name} {entry['version']}: cached copy unusable ({'; '.join(found)}); staging again",
                file=log,
            )
            shutil.rmtree(final)
        staged = stage_copy(source, cache, entry["version"])
        print(f"{name} {entry['version']}: staged from {source} to {staged}", file=log)
        return staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuplat-dataset", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("stage", "verify"):
        sub = commands.add_parser(command)
        sub.add_argument("name")
        sub.add_argument("--check", choices=("full", "size"), default="full")
    commands.add_parser("list")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if args.command == "stage":
            print(stage(config, args.name, args.check))
            return 0
        if args.command == "verify":
            entry = dataset(config, args.name)
            found = problems(Path(config["cache_path"]) / args.name / entry["version"], args.check)
            for problem in found:
                print(f"{args.name} {entry['version']}: {problem}")
            return 1 if found else 0
        for entry in config.get("datasets", []):
            cached = Path(config["cache_path"]) / entry["name"] / entry["version"] / MANIFEST
            state = "cached" if cached.is_file() else "-"
            print(f"{entry['name']}\t{entry['version']}\t{state}\t{entry['source']}")
        return 0
    except CacheError as exc:
        print(f"gpuplat-dataset: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
