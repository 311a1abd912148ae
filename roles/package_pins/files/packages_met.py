"""Exit 0 when every package given as an argument is installed, at its pin where it has one; exit 1 naming
those that are not. What `ansible.builtin.apt` with state=present would leave as it is, told by one
dpkg-query instead of apt's cache. Run by the node's Python; standard library only.

An argument is what the apt task is given: NAME, or NAME=VERSION where VERSION may hold fnmatch wildcards
(`1.2.3-*`). The apt module of ansible-core 2.19 keeps an installed package when dpkg's state is
"installed" (apt_pkg CURSTATE_INSTALLED) and, for NAME=VERSION, when fnmatch(installed version, VERSION)
holds (package_status, lib/ansible/modules/apt.py:528-609 at v2.19.14); anything else it installs,
downgrading where the task allows it. This check is met only in the first case, so a missing package, a
package left as config files or half installed, and one drifted off its pin all leave the task to run.
One difference, on purpose: where the installed version matches a wildcard pin and the index has a newer
build that matches it too, apt's install() asks apt-get for the pin again (apt.py:751-758, "legacy
behavior ... should not be relied upon"), which can move the package to that build; this check reads no
index and leaves the installed build. A node takes a new build when the pin names it.
Whatever it cannot judge as apt would (a name pattern, `>=`, a virtual package dpkg does not know) counts
as not met: the apt task then decides, as it always did.
"""

import fnmatch
import subprocess
import sys

# dpkg-query(1) of dpkg 1.21 (Debian 12) and 1.22 (Debian 13): db:Status-Abbrev is the desired action, the
# package status and the error flag; status "i" is installed, a space as the flag is no error.
FORMAT = "${Package}\t${db:Status-Abbrev}\t${Version}\n"
PATTERN_CHARACTERS = set("*?[]")


def parse(spec):
    """(name, version glob or None); None when apt would read it in a way this check does not (`>=`,
    patterns in the name)."""
    if ">=" in spec:
        return None
    name, _, version = spec.partition("=")
    if not name or PATTERN_CHARACTERS & set(name):
        return None
    return name, version or None


def installed_versions(names):
    """name -> version of the packages dpkg holds as installed without error."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", FORMAT, "--", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    # rc 1: some name is unknown to dpkg (it says so on stderr); the others are still listed.
    versions = {}
    for line in result.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) != 3:
            continue
        name, status, version = fields
        if len(status) >= 2 and status[1] == "i" and status[2:].strip() == "":
            versions[name] = version
    return versions


def unmet(specs):
    """The specs that are not met, each with why."""
    parsed = [(spec, parse(spec)) for spec in specs]
    judged = [item for item in parsed if item[1] is not None]
    versions = installed_versions([wanted[0] for _, wanted in judged]) if judged else {}
    reasons = []
    for spec, wanted in parsed:
        if wanted is None:
            reasons.append(f"{spec}: left to apt")
            continue
        name, version = wanted
        installed = versions.get(name)
        if installed is None:
            reasons.append(f"{spec}: not installed")
        elif version is not None and not fnmatch.fnmatch(installed, version):
            reasons.append(f"{spec}: {installed} installed")
    return reasons


def main(specs):
    try:
        reasons = unmet(specs)
    except OSError as error:  # no dpkg-query: not a Debian-family host, apt's task decides
        print(f"dpkg-query could not run: {error}")
        return 1
    print("; ".join(reasons) if reasons else "met")
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
