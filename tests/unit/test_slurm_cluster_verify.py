"""The Slurm cluster scenario's checks accept only the outcome they name, not any failure.

"A job asking for more memory than any node has is refused" must see Slurm's own reason: a job refused
for a wrong account or QoS also makes sbatch exit non-zero. slurmctld drops every node whose RealMemory
is below --mem (_build_node_list, src/slurmctld/node_scheduler.c) and answers
ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE, whose text in src/common/slurm_errno.c is the same in Slurm
22.05.8 and 24.11.5 (the Debian 12 and 13 releases the scenario runs); sbatch prints it after
"Batch job submission failed: "."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

VERIFY = Path(__file__).resolve().parents[2] / "molecule" / "slurm_cluster" / "verify" / "real_nodes.yml"
REFUSED_FOR_MEMORY = (
    "sbatch: error: Batch job submission failed: Requested node configuration is not available"
)


def failed(task_name: str, result: dict[str, Any]) -> bool:
    task = next(t for t in yaml.safe_load(VERIFY.read_text()) if t["name"] == task_name)
    condition = task["failed_when"]
    conditions = condition if isinstance(condition, list) else [condition]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    register = task["register"]
    return any(bool(env.compile_expression(c.strip())(**{register: result})) for c in conditions)


@pytest.mark.parametrize(
    ("result", "is_failure"),
    [
        ({"rc": 1, "stdout": "", "stderr": REFUSED_FOR_MEMORY}, False),
        (
            {
                "rc": 1,
                "stdout": "",
                "stderr": "sbatch: error: Batch job submission failed: Invalid account or account/partition "
                "combination specified",
            },
            True,
        ),
        (
            {
                "rc": 1,
                "stdout": "",
                "stderr": "sbatch: error: Batch job submission failed: Invalid qos specification",
            },
            True,
        ),
        ({"rc": 0, "stdout": "42", "stderr": ""}, True),
    ],
)
def test_the_too_big_job_must_be_refused_for_its_memory(result: dict[str, Any], is_failure: bool) -> None:
    assert failed("A job asking for more memory than any node has is refused", result) is is_failure
