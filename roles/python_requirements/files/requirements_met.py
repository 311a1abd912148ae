"""Exit 0 when every requirement given as an argument is installed in this interpreter's environment at
a version it allows, and so are its dependencies, all the way down (markers evaluated here, extras
followed); exit 1 naming the first one that is not. Run by the interpreter of the environment checked.

What `pip install REQ...` (no --upgrade) would leave as it is: pip keeps an installed distribution that
satisfies its requirement (prereleases allowed: InstallRequirement.check_if_exists,
src/pip/_internal/req/req_install.py of pypa/pip at 0013e5a3, the 23.0 line of Debian 12's python3-pip-whl;
in the resolver, get_installed_candidate in pip/_internal/resolution/resolvelib/factory.py:260-266 of the
pip-23.0.1 wheel) and resolves the rest from there, so it changes nothing exactly when this check passes.
--no-deps: check the named requirements only, as `pip install --no-deps` would.
"""

import sys
from importlib import metadata

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


def main(arguments: list[str]) -> int:
    follow = "--no-deps" not in arguments
    reason = unmet([a for a in arguments if a != "--no-deps"], follow)
    print(reason or "met")
    return 1 if reason else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
