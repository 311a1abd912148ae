"""Slurm's job states as `sacct -o State` prints them (its first word: "CANCELLED by 0"), for the tiers that
wait for a job on a real slurmctld (box, integration): a job in one of these has ended; PENDING, RUNNING,
REQUEUED and the states with flags (COMPLETING, ...) have not."""

from __future__ import annotations

JOB_ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
