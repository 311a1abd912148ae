#!/usr/bin/env python3
"""Write roles/nvidia_common/vars/releases.yml from infra/data/packages.yaml.

The GPU roles recognise the node's OS release and check every package version they are about to
pin against what the real repository publishes, from this generated file. Run it after editing the
facts; `--check` exits 1 when the committed file is stale (a unit test does the same).

  scripts/generate-role-facts.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.data.packages import package_facts, role_release_facts  # noqa: E402

TARGET = ROOT / "roles" / "nvidia_common" / "vars" / "releases.yml"
HEADER = """\
---
# Generated from infra/data/packages.yaml by scripts/generate-role-facts.py: do not edit.
# Per supported OS release: how Ansible recognises it, NVIDIA's repository path and key, the kernel
# headers DKMS needs, where aws-ofi-nccl lives, and every NVIDIA package with its published versions.
"""


class IndentedDumper(yaml.SafeDumper):
    """Indent list items under their key, as yamllint (ansible-lint) expects."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def render() -> str:
    document = {"__nvidia_common_releases": role_release_facts(package_facts())}
    return HEADER + yaml.dump(document, Dumper=IndentedDumper, sort_keys=False, width=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not TARGET.is_file() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run scripts/generate-role-facts.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
