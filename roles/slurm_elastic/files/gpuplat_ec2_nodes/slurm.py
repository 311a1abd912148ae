"""Slurm's side: node states, the jobs on a node, and the scontrol, squeue and scancel calls."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .logs import LOG

COMMAND_TIMEOUT_S = 60

# Slurm node state flags (`scontrol -o show node`, State=BASE+FLAG+...).
POWER_TRANSITIONS = frozenset({"POWER_UP", "POWERING_UP", "POWER_DOWN", "POWERING_DOWN"})
GOING_UP = frozenset({"POWER_UP", "POWERING_UP"})
POWERED_OFF = frozenset({"POWERED_DOWN", "POWERING_DOWN"})
# Drained or failed by an administrator or a health check: left to them.
HELD = frozenset({"DRAIN", "FAIL"})


def run_command(argv: Sequence[str], partial: bool = False) -> str | None:
    """stdout of the command, or None (logged) when it could not run or failed. partial: a command
    that failed still gives what it printed (logged), for commands that print what they could reach
    and exit 1 for the rest."""
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        LOG.error("%s: %s", " ".join(argv), err)
        return None
    if result.returncode != 0:
        LOG.error("%s failed (exit %d): %s", " ".join(argv), result.returncode, result.stderr.strip())
        return result.stdout if partial else None
    return result.stdout


@dataclass(frozen=True)
class NodeInfo:
    """One node of ``scontrol -o show node``: its state flags (base state included), NodeAddr, Reason."""

    name: str
    flags: frozenset[str]
    addr: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Job:
    """A job of ``squeue --Format=JobID,BatchFlag,Requeue``."""

    job_id: str
    batch: bool
    requeue: bool


_NODE_FIELDS = {key: re.compile(rf"(?:^|\s){key}=(\S*)") for key in ("NodeName", "State", "NodeAddr")}
# Reason (free text) is followed only by these fields (src/api/node_info.c, 21.08 to 24.11).
_NODE_REASON = re.compile(
    r"(?:^|\s)Reason=(.*?)(?=\s(?:Comment|Extra|InstanceId|InstanceType|ReservationName)=|$)"
)


def parse_nodes(text: str) -> dict[str, NodeInfo]:
    """Nodes by name from ``scontrol -o show node`` (one node per line)."""
    nodes: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        fields = {key: pattern.search(line) for key, pattern in _NODE_FIELDS.items()}
        name, state, addr = fields["NodeName"], fields["State"], fields["NodeAddr"]
        if name and state:
            reason = _NODE_REASON.search(line)
            nodes[name.group(1)] = NodeInfo(
                name=name.group(1),
                flags=frozenset(state.group(1).split("+")),
                addr=addr.group(1) if addr else "",
                reason=reason.group(1).strip() if reason else "",
            )
    return nodes


def parse_jobs(text: str) -> list[Job]:
    jobs = []
    for line in text.splitlines():
        columns = line.split()
        if len(columns) == 3 and columns[0].isdigit():
            jobs.append(Job(columns[0], batch=columns[1] != "0", requeue=columns[2] == "1"))
    return jobs


def parse_batch_children(text: str, job_ids: Sequence[str]) -> list[int]:
    """PIDs of `scontrol listpids` (PID JOBID STEPID LOCALID GLOBALID) in the batch step of these jobs
    that are not its task: the batch shell is the step's one task (a LOCALID), every process it
    started is listed with LOCALID "-" (src/scontrol/info_job.c _list_pids_one_step)."""
    wanted = set(job_ids)
    return [
        int(columns[0])
        for columns in (line.split() for line in text.splitlines())
        if len(columns) == 5 and columns[0].isdigit() and columns[1] in wanted
        and columns[2] == "batch" and columns[3] == "-"
    ]  # fmt: skip


class Slurm:
    def __init__(self, scontrol: str) -> None:
        self.scontrol = scontrol

    def tool(self, name: str) -> str:
        """squeue, scancel: beside scontrol."""
        return str(Path(self.scontrol).with_name(name))

    def update(self, names: Sequence[str], *settings: str) -> bool:
        argv = [self.scontrol, "update", f"nodename={','.join(names)}", *settings]
        ok = run_command(argv) is not None
        if ok:
            LOG.info("scontrol update nodename=%s %s", ",".join(names), " ".join(settings))
        return ok

    def set_address(self, name: str, address: str) -> bool:
        return self.update([name], f"nodeaddr={address}", f"nodehostname={name}")

    def power_down_force(self, names: Sequence[str], reason: str) -> bool:
        return self.update(names, "state=power_down_force", f"reason={reason}")

    def set_down(self, names: Sequence[str], reason: str) -> bool:
        return self.update(names, "state=down", f"reason={reason}")

    def power_up(self, names: Sequence[str]) -> bool:
        return self.update(names, "state=power_up")

    def drain(self, name: str, reason: str) -> bool:
        return self.update([name], "state=drain", f"reason={reason}")

    def nodes(self) -> dict[str, NodeInfo] | None:
        """Every node, or None (logged) when scontrol failed or listed none."""
        output = run_command([self.scontrol, "-o", "show", "node"])
        nodes = parse_nodes(output) if output is not None else {}
        if not nodes:
            LOG.error("cannot read the nodes from `%s -o show node`", self.scontrol)
            return None
        return nodes

    def jobs_on(self, name: str) -> list[Job] | None:
        """Running and suspended jobs with a share of the node, or None (logged) when squeue failed."""
        argv = [
            self.tool("squeue"),
            "--noheader",
            f"--nodelist={name}",
            "--states=RUNNING,SUSPENDED",
            "--Format=JobID,BatchFlag,Requeue",
        ]
        output = run_command(argv)
        return None if output is None else parse_jobs(output)

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        """The state of each job slurmctld still holds, finished ones included (until MinJobAge), or
        None (logged) when squeue failed."""
        argv = [
            self.tool("squeue"),
            "--noheader",
            f"--jobs={','.join(job_ids)}",
            "--states=all",
            "--Format=JobID,State",
        ]
        output = run_command(argv)
        if output is None:
            return None
        rows = (line.split() for line in output.splitlines())
        return {row[0]: row[1] for row in rows if len(row) == 2 and row[0].isdigit()}

    def batch_step_children(self, job_ids: Sequence[str]) -> list[int] | None:
        """The processes of these jobs' batch steps on this node, less each batch shell, or None
        (logged) when scontrol could not run. Run on the node: `scontrol listpids` asks its
        slurmstepds one after the other and exits 1 when one of them cannot be reached (a step that
        ended meanwhile, a stale socket) or there is no step, having printed the others
        (src/scontrol/info_job.c _list_pids_one_step, _list_pids_all_jobs; slurm-22-05-8-1 :609-623,
        :715-720): what it printed is used."""
        output = run_command([self.scontrol, "listpids"], partial=True)
        return None if output is None else parse_batch_children(output, job_ids)

    def signal_steps(self, name: str, signal: str) -> bool:
        """Signal the job steps of the node's jobs; not the batch shells (no --full)."""
        ok = run_command([self.tool("scancel"), f"--signal={signal}", f"--nodelist={name}"]) is not None
        if ok:
            LOG.info("signalled the job steps on %s with %s", name, signal)
        return ok

    def requeue(self, job_ids: Sequence[str]) -> bool:
        ok = run_command([self.scontrol, "requeue", ",".join(job_ids)]) is not None
        if ok:
            LOG.info("requeued jobs %s", ",".join(job_ids))
        return ok
