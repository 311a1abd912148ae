"""SLURM_RESUME_FILE: which of the names a resume launches belong to which job.

slurmctld writes a JSON file for each ResumeProgram run and names it in SLURM_RESUME_FILE
(src/slurmctld/power_save.c, _build_resume_job_json and _run_prog): {"jobs": [{"job_id": N, "nodes":
HOSTLIST}], ...} in 21.08 and 22.05 (slurm-21-08-5-1 :423, slurm-22-05-8-1 :424), "nodes_resume" in
place of "nodes" from 23.02 on (slurm-23-11-4-1 :450, slurm-24-11-5-1 :524; slurm.conf(5),
ResumeProgram). Each job's names are launched all or nothing (resume.py), as ParallelCluster 3.11 does
(aws-parallelcluster-node v3.11.0, src/slurm_plugin/resume.py:276 reads the file;
instance_manager.py:567 _add_instances_for_resume_file; fleet_manager.py:234 MinCount = count). Names
no job lists (an operator's `scontrol update state=power_up`) are launched best effort.
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
    first: "multiple jobs can request the same nodes", power_save.c). No file, or one that cannot be
    read, is no grouping (logged): every name is launched alone."""
    if not path:
        return []
    try:
        document = json.loads(Path(path).read_text())
        entries = document.get("jobs") or []
        jobs: list[ResumeJob] = []
        taken: set[str] = set()
        for entry in entries:
            hostlist = entry["nodes_resume"] if "nodes_resume" in entry else entry["nodes"]
            names = [n for n in expand_hostlist(str(hostlist)) if n not in taken]
            taken.update(names)
            if names:
                jobs.append(ResumeJob(str(entry["job_id"]), tuple(names)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UsageError) as err:
        LOG.warning("resume: cannot read the resume file %s (%s); launching each name on its own", path, err)
        return []
    return jobs
