"""The one domain exception of gpu-platform and the exit codes the CLI maps it to."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    POLICY_VIOLATION = 1
    BAD_INPUT = 2
    ENVIRONMENT = 3
    FAILED = 4
    NO_VERDICT = 5
    """an analysis that ended without a verdict to act on (a canary's: inconclusive, or cut short)"""


class GpuPlatError(Exception):
    """An error the user can act on: its message is one paragraph naming what to change."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0])


class SpecError(GpuPlatError):
    """A stack file or data file is missing, malformed or inconsistent."""

    exit_code = ExitCode.BAD_INPUT


class EnvironmentProblem(GpuPlatError):
    """A tool or host setting the command needs is missing (Pulumi CLI, podman, ...)."""

    exit_code = ExitCode.ENVIRONMENT
