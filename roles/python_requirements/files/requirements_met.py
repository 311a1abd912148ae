"""Exit 0 when every requirement given as an argument is installed in this interpreter's environment at
a version it allows, and so are its dependencies, all the way down (markers evaluated here, extras
followed); exit 1 naming the first one that is not. Run by the interpreter of the environment checked.

What `pip install REQ...` (no --upgrade) would leave as it is: pip keeps an installed distribution that
satisfies its requirement (prereleases allowed: InstallRequirement.check_if_exists,
src/pip/_internal/req/req_install.py of pypa/pip at 0013e5a3, the 23.0 line of Debian 12's python3-pip-whl;
in the resolver, get_installed_candidate in pip/_internal/resolution/resolvelib/factory.py:260-266 of the
pip-23.0.1 wheel) and resolves the rest from there, so it changes nothing exactly when this check passes.
--no-deps: check the named requirements only, as `pip install --no-deps` would.

--remember DIR: keep, in DIR (root's own: used only where no one else can write or move it), a digest of what
a check that passed read: the arguments, this check's own code, the interpreter and its path, and the stat
(inode, size, mtime and ctime) of every directory on the path, every *.dist-info and *.egg-info in them (and
an .egg directory's EGG-INFO) and the metadata files inside. A later check whose digest is the same answers
"met" without reading the metadata again (1,867 requirement lines parsed for torch's and MLflow's
environment, about 1 CPU-s).
Anything pip or a hand does to a distribution (installed, removed, upgraded, its METADATA edited: the
ctime moves even where mtime is set back) changes the digest, and the check reads everything again.
"""

import hashlib
import json
import marshal
import os
import stat
import sys
from importlib import metadata
from pathlib import Path
from types import FunctionType

# pip's own copy of packaging first: versions, specifiers and markers then read as the pip that would run
# reads them (Debian 12's pip 23.0.1 vendors packaging 21.3, which compares extras as written, where the
# environment's packaging may be newer or older), and nothing of the environment's own packages is imported.
try:
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.utils import canonicalize_name
except ImportError:  # an environment without pip: the same names from packaging itself
    from packaging.requirements import InvalidRequirement, Requirement  # type: ignore[assignment]
    from packaging.utils import canonicalize_name  # type: ignore[assignment]


def metadata_field(distribution: metadata.Distribution, key: str) -> str | None:
    fields = distribution.metadata  # None on newer Pythons where the folder holds no metadata file
    values = fields.get_all(key) if fields is not None else None
    return str(values[0]) if values else None


def unmet(texts: list[str], follow_dependencies: bool) -> str | None:
    """The first requirement not met, in words; None when all are."""
    pending: list[tuple[str, frozenset[str]]] = [(text, frozenset()) for text in texts]
    seen: set[tuple[str, str, frozenset[str]]] = set()
    while pending:
        text, wanted_extras = pending.pop()
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            return f"{text!r} is not a requirement this check reads"
        if requirement.url:
            return f"{text!r} names a URL: only pip can tell"
        if requirement.marker is not None and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in wanted_extras or {""}
        ):
            continue
        key = (canonicalize_name(requirement.name), str(requirement.specifier), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            return f"{requirement.name} is not installed"
        # pip skips an installed distribution whose metadata has no Name (and then installs it again):
        # _DistributionFinder._find_impl, pip/_internal/metadata/importlib/_envs.py:61-67, with
        # get_dist_name, _compat.py:46-55, of pip 23.0.1 (Debian 12's python3-pip-whl); importlib finds it
        # by its folder's name.
        name, version = metadata_field(distribution, "Name"), metadata_field(distribution, "Version")
        if name is None or version is None:
            return f"{requirement.name} is installed without a name and version in its metadata"
        if not requirement.specifier.contains(version, prereleases=True):
            return f"{requirement.name} {version} is installed, {requirement} is required"
        if follow_dependencies:
            # Older packaging (pip 23's copy) compares extras in markers as written, newer ones normalised.
            extras = frozenset(requirement.extras) | {canonicalize_name(e) for e in requirement.extras}
            pending += [(dependency, extras) for dependency in distribution.requires or []]
    return None


def stat_of(path: str) -> list[int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return [found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns]


def digest(arguments: list[str]) -> str:
    """What a check with these arguments reads, as a digest (see --remember above)."""
    # Every function of this check, as compiled: a change to what it decides is another digest.
    code = [
        marshal.dumps(value.__code__)
        for _, value in sorted(globals().items())
        if isinstance(value, FunctionType)
    ]
    listing: list[object] = []
    for entry in sys.path:
        listing.append([entry, stat_of(entry)])
        try:
            names = sorted(os.listdir(entry))
        except OSError:  # not a directory (a zip file: its stat above), or gone
            continue
        # The folders importlib.metadata reads a distribution from (Lookup, Lib/importlib/metadata/
        # __init__.py:826-842 of CPython 3.11): *.dist-info and *.egg-info, and an .egg directory's EGG-INFO.
        egg = os.path.basename(entry).lower().endswith(".egg")
        for name in names:
            if name.lower().endswith((".dist-info", ".egg-info")) or (egg and name.lower() == "egg-info"):
                folder = os.path.join(entry, name)
                listing.append(
                    [
                        name,
                        stat_of(folder),
                        [stat_of(os.path.join(folder, f)) for f in ("METADATA", "PKG-INFO", "requires.txt")],
                    ]
                )
    state = {
        "arguments": arguments,
        "code": hashlib.sha256(b"".join(code)).hexdigest(),
        # What markers are evaluated against (packaging's default_environment: os.uname() and the
        # interpreter's version and implementation).
        "python": [
            sys.version,
            sys.implementation.name,
            sys.executable,
            sys.prefix,
            sys.platform,
            os.name,
            list(os.uname()),
        ],
        "path": listing,
    }
    return hashlib.sha256(json.dumps(state, default=str).encode()).hexdigest()


def memory_file(directory: Path, arguments: list[str]) -> Path | None:
    """Where the digest of this environment and these arguments is kept; None where DIR is not root's alone
    (or whoever runs the check: its owner, not writable by group or others), or cannot be made, or where
    someone else could move DIR or a folder above it (and put a link to a folder of theirs in its place
    while the check runs): each folder of its resolved path is root's or the checking user's, and writable
    by no one else unless sticky (where only an entry's owner, the folder's or root renames or removes it:
    the restricted deletion flag of POSIX's rename() and unlink(), S_ISVTX in <sys/stat.h>)."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = Path(os.path.realpath(directory))
        found = os.lstat(directory)
        above = [os.lstat(folder) for folder in directory.parents]
    except OSError:
        return None
    if found.st_uid != os.geteuid() or found.st_mode & 0o022 or not stat.S_ISDIR(found.st_mode):
        return None
    for folder in above:
        if folder.st_uid not in (0, os.geteuid()) or (
            folder.st_mode & 0o022 and not folder.st_mode & stat.S_ISVTX
        ):
            return None
    name = hashlib.sha256(json.dumps([sys.prefix, sys.executable, arguments]).encode()).hexdigest()[:32]
    return directory / name


def remembered(memory: Path, now: str) -> bool:
    try:
        return memory.read_text() == now
    except OSError:
        return False


def remember(memory: Path, before: str, after: str) -> None:
    """Keep the digest of a check that passed, where nothing it read changed while it ran."""
    if before != after:
        return
    partial = memory.with_name(f"{memory.name}.{os.getpid()}")
    try:
        partial.write_text(before)
        partial.replace(memory)
    except OSError:
        partial.unlink(missing_ok=True)


def main(arguments: list[str]) -> int:
    memory: Path | None = None
    if "--remember" in arguments:
        at = arguments.index("--remember")
        if at + 1 >= len(arguments):
            print("--remember needs a directory")
            return 2
        memory = memory_file(Path(arguments[at + 1]), arguments[:at] + arguments[at + 2 :])
        arguments = arguments[:at] + arguments[at + 2 :]
    before = digest(arguments) if memory is not None else ""
    if memory is not None and remembered(memory, before):
        print("met (remembered: nothing the check reads has changed since it passed)")
        return 0
    follow = "--no-deps" not in arguments
    reason = unmet([a for a in arguments if a != "--no-deps"], follow)
    if memory is not None:
        if reason is None:
            remember(memory, before, digest(arguments))
        else:
            memory.unlink(missing_ok=True)
    print(reason or "met")
    return 1 if reason else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
