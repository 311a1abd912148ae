#!/usr/bin/env python3
"""What a converge of the model-server role may do with a node's replicas, given what `gpuplat serve` holds
there (roles/inference_server tasks/service.yml runs it before any change; stdlib only, read-only).

`gpuplat serve` (infra/serving/release.py) writes the canary slot's version file, version-canary.env. A
canary that borrows a stable replica's GPUs (serving.canary.gpus borrow) records the loan in it: a line
`<mark>N` naming replica N, and the replica's CUDA_VISIBLE_DEVICES, which the canary runs on; the replica is
drained on the gateways, masked until the next boot and stopped. A canary on the node's spare GPU group
(spare) runs on the group replica-canary.env names. Until `gpuplat serve rollback` or `promote` ends the
release, the role must neither start the lent replica (on the canary's GPUs) nor give any replica GPUs the
canary runs on.

    gpuplat_replica_loan.py --config-dir DIR --version-mark MARK --loan-mark MARK --node NAME \\
        --replicas R --replica-gpus JSON --canary-gpus GROUP [--textfile-dir DIR --stopped-file PATTERN]

(the marks: the role's __inference_server_version_mark and __inference_server_loan_mark, which
release.py reads too)

answers one JSON object: `lent`, the replicas the role leaves alone (the loan's); `retire`, the replicas the
node has (replica-N.env) that the layout no longer gives it (N >= R), which the role drains and stops;
`adopt`, pairs [N, M]: replica N, which the layout adds (no replica-N.env yet: a layout grown back, a switch
from spare to borrow), takes replica M's version file before it first starts, so that it serves the version
its peers serve (the champion a promote rolled out) rather than the stack's own model; `forget`, the
replicas the layout adds beside peers on the stack's own model that still have a version file (a retire
killed between its two removals), whose version-N.env the role removes before they first start; and
`problem`, a paragraph for the operator where the layout asked for would take GPUs the canary holds (a
switch to spare, fewer replicas, other GPU groups) or adds a replica while its peers serve different
versions (a promote or rollback not finished), "" where there is none. With --textfile-dir (node_exporter's
textfile collector directory) and --stopped-file (the file naming replica N stopped on purpose: PATTERN %
N), also `marking`, whether that directory exists (the role says there which replica it retires), and
`unmark`, the replicas with such a file that the role starts (a retired replica the layout adds again, a
loan given back by a command killed before it removed the file): their files go, so that they page again if
they die.
Exit 0 (also with a problem: the role refuses with its text), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPLICA_FILE = re.compile(r"^replica-(\d+)\.env$")


@dataclass(frozen=True)
class Held:
    """What the node's canary holds: its version, the replica it borrows (None: none), its GPUs."""

    version: str
    lent: int | None
    gpus: frozenset[str]


def devices(text: str) -> frozenset[str]:
    """The GPU indexes of an EnvironmentFile's last CUDA_VISIBLE_DEVICES line (as systemd reads it)."""
    found = ""
    for line in text.splitlines():
        if line.startswith("CUDA_VISIBLE_DEVICES="):
            found = line.partition("=")[2]
    return frozenset(g.strip() for g in found.split(",") if g.strip())


@dataclass(frozen=True)
class Marks:
    version: str
    """a version file's line naming its version: this, then the version"""
    loan: str
    """a borrowing canary's version file's line naming the replica it borrows: this, then its number"""


def held(config_dir: Path, marks: Marks) -> Held | None:
    """What the canary holds on this node, from its version file (None: no canary release here)."""
    record = config_dir / "version-canary.env"
    if not record.is_file():
        return None
    text = record.read_text()
    version, lent = "?", None
    for line in text.splitlines():
        if line.startswith(marks.version):
            version = line.removeprefix(marks.version).strip()
        number = line.removeprefix(
            marks.loan
        ).strip()  # an editor's trailing blank or CR, as release.py reads it
        if line.startswith(marks.loan) and number.isdigit():
            lent = int(number)
    if lent is not None:
        return Held(version, lent, devices(text))
    spare = config_dir / "replica-canary.env"
    return Held(version, None, devices(spare.read_text()) if spare.is_file() else frozenset())


def replicas_present(config_dir: Path) -> list[int]:
    """The replicas the role configured on this node (replica-N.env)."""
    if not config_dir.is_dir():
        return []
    found = (REPLICA_FILE.match(path.name) for path in config_dir.iterdir())
    return sorted(int(match.group(1)) for match in found if match)


def problem(node: str, canary: Held, replicas: int, replica_gpus: list[str], canary_gpus: str) -> str:
    """Why the layout asked for cannot be applied while the canary holds what it holds ("": it can)."""
    model = canary.version.partition("@")[0]
    reasons = []
    if canary.lent is not None and canary_gpus:
        reasons.append(
            f"the layout keeps GPU group {canary_gpus} spare for the canary (serving.canary.gpus spare), but "
            f"the running canary borrows replica {canary.lent}"
        )
    elif canary.lent is not None and canary.lent >= replicas:
        reasons.append(f"the layout gives the node {replicas} replica(s), so none numbered {canary.lent}")
    for number, group in enumerate(replica_gpus[:replicas]):
        taken = devices(f"CUDA_VISIBLE_DEVICES={group}") & canary.gpus
        if number != canary.lent and taken:
            reasons.append(
                f"replica {number} would start on GPU(s) {','.join(sorted(taken))}, which the canary runs on"
            )
    if not reasons:
        return ""
    where = (
        f"on replica {canary.lent}'s GPUs ({','.join(sorted(canary.gpus)) or 'none'}), lent to it"
        if canary.lent is not None
        else f"on the node's spare GPU group ({','.join(sorted(canary.gpus)) or 'none'})"
    )
    return (
        f"{node} runs the canary {canary.version} of a release `gpuplat serve` has not ended, {where} "
        f"(its record: version-canary.env); this converge would change the node's replicas under it: "
        f"{'; '.join(reasons)}. Nothing was changed on {node}. End the release first: `gpuplat serve "
        f"rollback {model}` (or `gpuplat serve promote {model}`) gives the GPUs back, then run `gpuplat up` "
        "again."
    )


def served(config_dir: Path, marks: Marks, replica: int) -> str:
    """What a replica's version file (version-N.env, written by `gpuplat serve` only) says it serves: its
    whole text, "" where it has none (the stack's own model)."""
    path = config_dir / f"version-{replica}.env"
    return path.read_text().strip() if path.is_file() else ""


def version_named(text: str, marks: Marks) -> str:
    """The version a version file's text names, for the operator ("the stack's own model" where none)."""
    for line in text.splitlines():
        if line.startswith(marks.version):
            return line.removeprefix(marks.version).strip()
    return "the stack's own model" if not text else "an unnamed version"


def adoption(
    config_dir: Path, marks: Marks, node: str, replicas: int, present: list[int]
) -> tuple[list[list[int]], list[int], str]:
    """The replicas the layout adds, each paired with the peer whose version file it takes ([] where the
    peers serve the stack's own model or nothing is added); those added beside peers on the stack's own
    model that have a version file of their own (a retire killed between removing replica-N.env and
    version-N.env), which goes, or the replica would start on that stale version; and a paragraph where
    the peers disagree."""
    added = [n for n in range(replicas) if n not in present]
    if not added or not present:
        return [], [], ""
    versions = {peer: served(config_dir, marks, peer) for peer in present}
    if len(set(versions.values())) > 1:
        serving = ", ".join(f"replica {peer}: {version_named(t, marks)}" for peer, t in versions.items())
        model = next((version_named(t, marks).partition("@")[0] for t in versions.values() if t), "MODEL")
        paragraph = (
            f"{node}'s replicas serve different versions ({serving}): a `gpuplat serve` promote or rollback "
            f"did not finish. This converge adds replica(s) {', '.join(map(str, added))}, which would serve "
            f"none of them for certain. Nothing was changed on {node}. Finish the release first: `gpuplat "
            f"serve rollback {model}` (or `gpuplat serve promote {model}`) puts every replica on one "
            "version, then run `gpuplat up` again."
        )
        return [], [], paragraph
    source = present[0]
    if versions[source]:
        return [[n, source] for n in added], [], ""
    return [], [n for n in added if (config_dir / f"version-{n}.env").is_file()], ""


def plan(
    config_dir: Path, marks: Marks, node: str, replicas: int, replica_gpus: list[str], canary_gpus: str
) -> dict[str, object]:
    canary = held(config_dir, marks)
    lent = [] if canary is None or canary.lent is None else [canary.lent]
    present = replicas_present(config_dir)
    adopt, forget, mixed = adoption(config_dir, marks, node, replicas, present)
    loaned = "" if canary is None else problem(node, canary, replicas, replica_gpus, canary_gpus)
    return {
        "lent": lent,
        "retire": [n for n in present if n >= replicas and n not in lent],
        "adopt": adopt,
        "forget": forget,
        "problem": " ".join(text for text in (loaned, mixed) if text),
    }


def stopped_marks(textfile_dir: Path, pattern: str, replicas: int, lent: list[int]) -> dict[str, object]:
    """Whether the textfile collector's directory exists, and the replicas the role starts (the layout's, but
    the lent one) whose file says the platform stopped them on purpose."""
    marking = textfile_dir.is_dir()
    stale = [n for n in range(replicas) if n not in lent and (textfile_dir / (pattern % n)).is_file()]
    return {"marking": marking, "unmark": stale if marking else []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--config-dir", type=Path, required=True)
    parser.add_argument("--version-mark", required=True, help="a version file's line naming its version")
    parser.add_argument("--loan-mark", required=True, help="the loan's line in the canary's version file")
    parser.add_argument("--node", required=True)
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument(
        "--replica-gpus", required=True, help="JSON list: each replica's CUDA_VISIBLE_DEVICES"
    )
    parser.add_argument("--canary-gpus", default="", help="the spare GPU group ('' where none)")
    parser.add_argument("--textfile-dir", type=Path, help="node_exporter's textfile collector directory")
    parser.add_argument("--stopped-file", default="", help="the file naming replica N stopped: PATTERN % N")
    arguments = parser.parse_args(argv)
    try:
        groups = json.loads(arguments.replica_gpus)
    except ValueError:
        groups = None
    if not isinstance(groups, list):
        parser.error(f"--replica-gpus is a JSON list of each replica's GPUs, not {arguments.replica_gpus!r}")
    marks = Marks(arguments.version_mark, arguments.loan_mark)
    answer = plan(
        arguments.config_dir,
        marks,
        arguments.node,
        arguments.replicas,
        [str(group) for group in groups],
        arguments.canary_gpus,
    )
    if arguments.textfile_dir is not None:
        if "%s" not in arguments.stopped_file:
            parser.error(f"--stopped-file names replica N's file with %s, not {arguments.stopped_file!r}")
        lent = answer["lent"]
        assert isinstance(lent, list)
        answer |= stopped_marks(arguments.textfile_dir, arguments.stopped_file, arguments.replicas, lent)
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
