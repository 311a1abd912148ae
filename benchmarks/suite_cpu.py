"""Where `make test`'s CPU goes: runs its streams side by side, as `make test` does, each in a cpuacct cgroup
of its own, samples every podman container's cgroup and the machine's /proc/stat every few seconds, and
prints the CPU-minutes of each stream (the host-side work, Ansible's modules included: the podman
connection runs them with nsenter from the host), of the containers by name (their own daemons and boot
programs), and the machine's busy and idle CPU over the run.

    sudo .venv/bin/python benchmarks/suite_cpu.py                     (the streams of `make test`)
    sudo .venv/bin/python benchmarks/suite_cpu.py static=lint,test-unit box=test-box

Needs root and a cgroup v1 cpuacct hierarchy (the test machines'; podman there puts containers under
libpod_parent). The make targets' own output goes to build/suite-cpu/<stream>.<target>.log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
CONTAINERS = CPUACCT / "libpod_parent"
ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "build" / "suite-cpu"
SAMPLE_S = 5.0


@dataclass
class Samples:
    """Highest usage seen per cgroup (ns), what each had when first seen, container names by id."""

    usage: dict[str, int] = field(default_factory=dict)
    baseline: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    stat: list[list[int]] = field(default_factory=list)

    def take(self, groups: list[Path], first: bool) -> None:
        for group in groups:
            try:
                used = int((group / "cpuacct.usage").read_text())
            except (OSError, ValueError):
                continue  # gone between listing and reading
            if first:
                self.baseline[group.name] = used
            self.usage[group.name] = max(self.usage.get(group.name, 0), used)
        listing = subprocess.run(
            ["podman", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        for line in listing.stdout.splitlines():
            container_id, _, name = line.partition(" ")
            self.names[container_id] = name
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        self.stat.append([int(v) for v in fields])

    def minutes(self, group: str) -> float:
        return (self.usage.get(group, 0) - self.baseline.get(group, 0)) / 60e9


def sampler(samples: Samples, streams: list[str], stop: threading.Event) -> None:
    first = True
    while not stop.is_set():
        groups = [CPUACCT / f"suite-cpu-{s}" for s in streams] + sorted(CONTAINERS.glob("libpod-*"))
        samples.take(groups, first)
        first = False
        stop.wait(SAMPLE_S)


def run_stream(name: str, targets: list[str], walls: dict[str, float], codes: dict[str, int]) -> None:
    group = CPUACCT / f"suite-cpu-{name}"
    group.mkdir(exist_ok=True)
    for target in targets:
        start = time.monotonic()
        with (LOGS / f"{name}.{target}.log").open("w") as log:
            # The child joins the stream's cgroup before make starts; everything it starts inherits it.
            code = subprocess.run(
                ["sh", "-c", f'echo $$ > "{group}/tasks" && exec make --no-print-directory {target}'],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False,
                env={**os.environ, "GPUPLAT_ROLES_LINTED": "1"},
            ).returncode  # fmt: skip
        walls[f"{name} {target}"] = time.monotonic() - start
        codes[f"{name} {target}"] = code
        if code != 0:
            return


def container_kind(name: str) -> str:
    """A container's name without its instance number or id: one line per kind of node."""
    return re.sub(r"\d+$", "N", re.sub(r"-[0-9a-f]{6,}$", "", name))


def report(samples: Samples, streams: list[str], walls: dict[str, float], codes: dict[str, int]) -> str:
    lines = ["wall (min), exit code per stream and target:"]
    lines += [f"  {k:40s} {v / 60:6.1f}  rc={codes[k]}" for k, v in walls.items()]
    lines.append("CPU-minutes, host side per stream:")
    lines += [f"  {s:40s} {samples.minutes(f'suite-cpu-{s}'):6.1f}" for s in streams]
    kinds: dict[str, float] = {}
    for group in samples.usage:
        if group.startswith("libpod-"):
            name = samples.names.get(group.removeprefix("libpod-"), "(unnamed)")
            kind = container_kind(name)
            kinds[kind] = kinds.get(kind, 0.0) + samples.minutes(group)
    lines.append("CPU-minutes, inside containers by kind:")
    lines += [f"  {k:40s} {v:6.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.05]
    first, last = samples.stat[0], samples.stat[-1]
    ticks = os.sysconf("SC_CLK_TCK") * 60
    idle = (last[3] + last[4] - first[3] - first[4]) / ticks
    busy = (sum(last) - sum(first)) / ticks - idle
    lines.append(f"machine: {busy:.1f} CPU-minutes busy, {idle:.1f} idle")
    return "\n".join(lines)


def make_test_streams(makefile: Path = ROOT / "Makefile") -> dict[str, list[str]]:
    """The streams `make test` runs side by side: the arguments of its scripts/test-streams.sh line."""
    recipe = makefile.read_text().replace("\\\n", " ")
    line = next(line for line in recipe.splitlines() if line.startswith("\t") and "test-streams.sh" in line)
    streams = [stream.split() for stream in shlex.split(line.split("scripts/test-streams.sh", 1)[1])]
    return {targets[0].removeprefix("test-"): targets for targets in streams}


def parse_streams(arguments: list[str]) -> dict[str, list[str]]:
    if not arguments:
        return make_test_streams()
    streams = {}
    for argument in arguments:
        name, _, targets = argument.partition("=")
        if not name or not targets or not re.fullmatch(r"[a-z0-9-]+", name):
            raise SystemExit(f"suite_cpu.py: '{argument}' is not NAME=TARGET[,TARGET...] (NAME: a-z, 0-9, -)")
        streams[name] = targets.split(",")
    return streams


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", nargs="*", help="NAME=TARGET[,TARGET...] (default: make test's streams)")
    streams = parse_streams(parser.parse_args().streams)
    if os.geteuid() != 0 or not CPUACCT.is_dir():
        print(
            "suite_cpu.py: needs root and a cgroup v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct",
            file=sys.stderr,
        )
        return 3
    LOGS.mkdir(parents=True, exist_ok=True)
    samples, stop = Samples(), threading.Event()
    walls: dict[str, float] = {}
    codes: dict[str, int] = {}
    watcher = threading.Thread(target=sampler, args=(samples, list(streams), stop), daemon=True)
    watcher.start()
    workers = [
        threading.Thread(target=run_stream, args=(name, targets, walls, codes))
        for name, targets in streams.items()
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    watcher.join()
    samples.take([CPUACCT / f"suite-cpu-{s}" for s in streams], first=False)
    print(report(samples, list(streams), walls, codes))
    for name in streams:
        with contextlib.suppress(OSError):  # a container's conmon may still be in it
            (CPUACCT / f"suite-cpu-{name}").rmdir()
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
