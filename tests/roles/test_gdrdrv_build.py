"""gdrdrv follows the driver the node pins (roles/rdma/files/gpuplat-gdrdrv-build.sh, tasks/gdrcopy.yml).

GDRCopy's DKMS package rebuilds gdrdrv for a new kernel only (NVIDIA/gdrcopy v2.5.2 packages/dkms.conf:
AUTOINSTALL, no tie to the nvidia module), and its Makefile compiles against the first nvidia-* source it
finds, in the flavour that source has (src/gdrdrv/Makefile NVIDIA_SRC_DIR, NVIDIA_IS_OPENSOURCE; README.md
"Notes": a gdrdrv built for the open flavour does not load beside the proprietary driver). A driver changed
on day 2 must rebuild it against the new driver's source; a second converge must not rebuild; a build cut
short must be done again. The script runs here against stand-ins of dkms and modinfo that keep dkms 2.8's
rule (prepare_build: a module already built for the kernel is refused, die 3) and against driver source
trees of two drivers.

Not modelled: the real kernel build (the stand-in dkms records what it was asked and with which
NVIDIA_SRC_DIR) and modprobe; the role's own load steps are checked in their YAML."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "rdma"
BUILD = ROLE / "files" / "gpuplat-gdrdrv-build.sh"
KERNEL = "6.8.0-1021-aws"

DKMS = """#!/bin/sh
# dkms stand-in: ACTION -m gdrdrv -v VERSION -k KERNEL; the tree is $FAKE/tree/<kernel>.
echo "$1 ${NVIDIA_SRC_DIR:-}" >>"$FAKE/dkms.log"
kernel=$7
case $1 in
  unbuild) [ -d "$FAKE/tree/$kernel" ] || exit 2; rm -rf "$FAKE/tree/$kernel" ;;
  build)
    [ ! -d "$FAKE/tree/$kernel" ] || { echo "Error! This module/version has already been built" >&2; exit 3; }
    [ ! -f "$FAKE/fail-build" ] || { echo "make: *** [Makefile:42: build] Error 2" >&2; exit 10; }
    mkdir -p "$FAKE/tree/$kernel" && echo "$NVIDIA_SRC_DIR" >"$FAKE/tree/$kernel/built-against" ;;
  install) [ -d "$FAKE/tree/$kernel" ] && touch "$FAKE/tree/$kernel/installed" ;;
  *) exit 99 ;;
esac
"""
MODINFO = """#!/bin/sh
# modinfo stand-in: -k KERNEL gdrdrv
[ -f "$FAKE/tree/$2/installed" ]
"""


class Node:
    """A node's /usr/src with two drivers' sources, dkms and modinfo stand-ins, and the role's record."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.src = base / "usr-src"
        for driver in ("570.195.03", "580.95.05"):
            (self.src / f"nvidia-{driver}" / "nvidia").mkdir(parents=True)
            (self.src / f"nvidia-{driver}" / "nvidia" / "nv-p2p.c").write_text("/* nv-p2p */\n")
        bin_dir = base / "bin"
        bin_dir.mkdir()
        for name, text in (("dkms", DKMS), ("modinfo", MODINFO)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE": str(base),
            "GPUPLAT_NVIDIA_SRC_ROOTS": f"{base / 'kernel-modules'} {self.src}",
        }
        self.state = base / "gpuplat-gdrdrv-built"

    def build(
        self, driver: str, flavour: str = "open", kernel: str = KERNEL
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BUILD), "2.5.2", driver, flavour, kernel, str(self.state)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
        )

    def dkms_calls(self) -> list[str]:
        log = self.base / "dkms.log"
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return calls

    def built_against(self, kernel: str = KERNEL) -> str:
        return (self.base / "tree" / kernel / "built-against").read_text().strip()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_it_builds_against_the_pinned_drivers_source_not_the_first_found(node: Node) -> None:
    """Both drivers' sources are there (an older one left behind); the Makefile's own find would take
    nvidia-570.195.03, the first."""
    done = node.build("580.95.05")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built"
    assert node.built_against() == str(node.src / "nvidia-580.95.05" / "nvidia")
    assert [c.split()[0] for c in node.dkms_calls()] == ["unbuild", "build", "install"]


def test_a_second_converge_builds_nothing(node: Node) -> None:
    assert node.build("580.95.05").returncode == 0
    node.dkms_calls()
    again = node.build("580.95.05")
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert node.dkms_calls() == []


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (("570.195.03", "open"), ("580.95.05", "open")),  # a driver upgraded on day 2
        (("580.95.05", "proprietary"), ("580.95.05", "open")),  # the flavour switched, same version
        (("580.95.05", "open"), ("580.95.05", "open", "6.8.0-1024-aws")),  # a new kernel
    ],
)
def test_a_changed_driver_flavour_or_kernel_rebuilds(
    node: Node, first: tuple[str, ...], then: tuple[str, ...]
) -> None:
    assert node.build(*first).stdout.strip() == "built"
    node.dkms_calls()
    done = node.build(*then)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built"
    kernel = then[2] if len(then) > 2 else KERNEL
    assert node.built_against(kernel) == str(node.src / f"nvidia-{then[0]}" / "nvidia")


def test_a_module_gone_from_the_kernel_is_built_again(node: Node) -> None:
    """The record matches, but the module is not installed for the kernel (removed by hand, a dkms remove):
    the record alone does not skip the build."""
    assert node.build("580.95.05").returncode == 0
    (node.base / "tree" / KERNEL / "installed").unlink()
    node.dkms_calls()
    done = node.build("580.95.05")
    assert done.stdout.strip() == "built" and "build" in " ".join(node.dkms_calls())


def test_a_failed_build_leaves_no_record_and_the_next_run_builds(node: Node) -> None:
    assert node.build("570.195.03").returncode == 0
    (node.base / "fail-build").touch()
    failed = node.build("580.95.05")
    assert failed.returncode == 1
    assert "did not build for kernel" in failed.stderr and "Error 2" in failed.stderr
    assert not node.state.exists()
    (node.base / "fail-build").unlink()
    assert node.build("580.95.05").stdout.strip() == "built"


def test_a_driver_without_its_source_is_refused(node: Node) -> None:
    done = node.build("590.10.01")
    assert done.returncode == 1
    assert "no source of NVIDIA driver 590.10.01" in done.stderr and done.stderr.count("\n") == 1
    assert node.dkms_calls() == []


def test_the_role_builds_for_the_pinned_driver_and_loads_gdrdrv_only_on_it() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "gdrcopy.yml").read_text())
    [build] = [t for t in tasks if "gpuplat-gdrdrv-build" in str(t.get("ansible.builtin.command", ""))]
    argv = build["ansible.builtin.command"]["argv"]
    assert argv[2:5] == [
        "{{ gpu_driver_version }}",
        "{{ 'open' if gpu_driver_open_kernel_modules | bool else 'proprietary' }}",
        "{{ ansible_facts['kernel'] }}",
    ]
    assert "when" not in build  # every converge asks; the script decides
    [load] = [t for t in tasks if "block" in t and "gdrdrv" in t["name"]]
    assert load["when"] == "__rdma_nvidia_loaded_version == gpu_driver_version"
    unload = next(t for t in load["block"] if "community.general.modprobe" in t)
    assert unload["community.general.modprobe"] == {"name": "gdrdrv", "state": "absent"}
    assert "__rdma_gdrdrv_build is changed" in unload["when"]
    names = [t["name"] for t in load["block"]]
    assert names.index(unload["name"]) < names.index("Start gdrdrv")
    assert "rescue" in load
