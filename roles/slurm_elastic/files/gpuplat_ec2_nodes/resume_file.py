"""SLURM_RESUME_FILE: which of the names a resume launches belong to which job.

slurmctld writes a JSON file for each ResumeProgram run and names it in SLURM_RESUME_FILE (Slurm 22.05
and later; slurm.conf(5), ResumeProgram): {"all_nodes_resume": HOSTLIST, "jobs": [{"job_id": N,
"nodes_resume": HOSTLIST, "nodes_alloc": HOSTLIST, ...}]}. Each job's nodes_resume are launched all or
nothing (resume.py), as ParallelCluster 3.11 does (aws-parallelcluster-node v3.11.0,
src/slurm_plugin/resume.py:276 reads the file; instance_manager.py:567 _add_instances_for_resume_file;
fleet_manager.py:234 MinCount = count). Slurm 21.08 writes no file: every name is then launched on its
own, as are names no job lists (an operator's `scontrol update state=power_up`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .exit_codes import UsageError
from .hostlist import expand_hostlist
from .logs import LOG


@dataclass(frozen=True)
class ResumeJob:
    job_id: str
    names: tuple[str, ...]


def read_resume_file(path: str | None) -> list[ResumeJob]:
    """The jobs of the resume file, each with the names it resumes (a name in two jobs stays with the
    first). No file, or one that cannot be read, is no grouping (logged): every name is launched alone."""
    if not path:
        return []
    try:
        document = json.loads(Path(path).read_text())
        entries = document.get("jobs") or []
        jobs: list[ResumeJob] = []
        taken: set[str] = set()
        for entry in entries:
            names = [n for n in expand_hostlist(str(entry["nodes_resume"])) if n not in taken]
            taken.update(names)
            if names:
                jobs.append(ResumeJob(str(entry["job_id"]), tuple(names)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UsageError) as err:
        LOG.warning("resume: cannot read the resume file %s (%s); launching each name on its own", path, err)
        return []
    return jobs
