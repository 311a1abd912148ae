"""A cloud stack's life through the Pulumi Automation API (pulumi.automation): preview against what is
deployed, up after approval, status, destroy, and the list of stacks the backend holds.

Every call here needs the Pulumi CLI (the Automation API drives it); without it they stop with exit 3 and
the command that installs it. Pulumi's own lines stream to the caller as they come, so an EKS cluster or
an FSx filesystem that takes tens of minutes is not silent.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infra.errors import EnvironmentProblem, ExitCode, GpuPlatError, SpecError
from infra.lifecycle.fleet_holds import FleetHolds
from infra.platform.resolve import ResolvedPlatform
from infra.spec.load import PROJECT_ROOT

INSTALL_PULUMI = (
    "curl -fsSL https://get.pulumi.com | sh (https://www.pulumi.com/docs/install/), then `pulumi login`"
)
# Pulumi's operation names in a change summary (apitype.OpType); `same` changes nothing.
_CHANGING = ("create", "update", "replace", "create-replacement", "delete-replaced", "delete", "import")

Line = Callable[[str], None]


class AutomationStack(Protocol):
    """The part of pulumi.automation.Stack used here (pulumi/automation/_stack.py: preview, up, destroy,
    outputs, info; PreviewResult.change_summary, UpResult.outputs, DestroyResult.summary)."""

    @property
    def name(self) -> str: ...

    def preview(self, *, diff: bool | None = ..., on_output: Line | None = ...) -> Any: ...

    def up(self, *, diff: bool | None = ..., on_output: Line | None = ...) -> Any: ...

    def destroy(self, *, on_output: Line | None = ...) -> Any: ...

    def refresh(self, *, preview_only: bool | None = ..., on_output: Line | None = ...) -> Any: ...

    def outputs(self) -> Mapping[str, Any]: ...

    def info(self) -> Any: ...


@dataclass(frozen=True)
class Changes:
    """A preview's change summary: operation -> resource count."""

    counts: dict[str, int] = field(default_factory=dict)

    @property
    def changing(self) -> int:
        return sum(n for op, n in self.counts.items() if op in _CHANGING)

    def line(self) -> str:
        shown = [f"{n} to {op}" for op, n in sorted(self.counts.items()) if op in _CHANGING and n]
        same = self.counts.get("same", 0)
        return (", ".join(shown) or "no changes") + (f"; {same} unchanged" if same else "")


@dataclass(frozen=True)
class CloudStatus:
    stack: str
    last_update: str | None
    last_result: str | None
    resource_changes: dict[str, int]
    outputs: dict[str, Any]
    holds: FleetHolds | None = None  # aws Slurm stacks: each training pool's hold (fleet_holds.py)


def require_pulumi(platform: ResolvedPlatform, action: str) -> None:
    if shutil.which("pulumi") is None:
        raise EnvironmentProblem(
            f"{action} of the {platform.spec.backend} stack {platform.name} goes through the Pulumi "
            f"Automation API, which needs the Pulumi CLI: install it with {INSTALL_PULUMI}. `gpuplat plan` "
            "and `gpuplat check` work without it."
        )


# The stack file the Pulumi program reads its platform from, where it is not stacks/Pulumi.NAME.yaml
# (`--stack-file`): infra/program.py reads this variable for the file's path.
STACK_FILE_ENV = "GPUPLAT_STACK_FILE"


@dataclass(frozen=True)
class FromStackFile:
    """A Pulumi stack whose configuration is the stack file the command was given, in every operation:
    `--config-file` (pulumi/automation/_stack.py: preview, up, destroy and refresh take `config_file`),
    so `--stack-file` deploys that file, not stacks/Pulumi.NAME.yaml of the same name."""

    stack: Any
    config_file: str

    @property
    def name(self) -> str:
        return str(self.stack.name)

    def preview(self, *, diff: bool | None = None, on_output: Line | None = None) -> Any:
        return self.stack.preview(diff=diff, on_output=on_output, config_file=self.config_file)

    def up(self, *, diff: bool | None = None, on_output: Line | None = None) -> Any:
        return self.stack.up(diff=diff, on_output=on_output, config_file=self.config_file)

    def destroy(self, *, on_output: Line | None = None) -> Any:
        return self.stack.destroy(on_output=on_output, config_file=self.config_file)

    def refresh(self, *, preview_only: bool | None = None, on_output: Line | None = None) -> Any:
        return self.stack.refresh(
            preview_only=preview_only, on_output=on_output, config_file=self.config_file
        )

    def outputs(self) -> Mapping[str, Any]:
        outputs: Mapping[str, Any] = self.stack.outputs()
        return outputs

    def info(self) -> Any:
        return self.stack.info()


def open_stack(platform: ResolvedPlatform, action: str, *, create: bool) -> AutomationStack:
    """The stack in the Pulumi backend: created when `create` (first `up`), else it must exist. Its
    configuration is the platform's own stack file, wherever that is."""
    if platform.spec.backend == "local":
        raise SpecError(f"stack {platform.name} is local: it has no Pulumi stack (`gpuplat status` shows it)")
    require_pulumi(platform, action)
    from pulumi import automation

    config_file = str(Path(platform.source).resolve())
    options = automation.LocalWorkspaceOptions(env_vars={STACK_FILE_ENV: config_file})
    if create:
        created = automation.create_or_select_stack(
            stack_name=platform.name, work_dir=str(PROJECT_ROOT), opts=options
        )
        return FromStackFile(created, config_file)
    try:
        selected = automation.select_stack(stack_name=platform.name, work_dir=str(PROJECT_ROOT), opts=options)
    except automation.errors.StackNotFoundError as exc:
        raise GpuPlatError(
            f"stack {platform.name} is not deployed in the current Pulumi backend (`pulumi whoami -v` names "
            f"it): `gpuplat up --stack-file {platform.source}` creates it",
            exit_code=ExitCode.BAD_INPUT,
        ) from exc
    return FromStackFile(selected, config_file)


def preview(stack: AutomationStack, on_line: Line) -> Changes:
    """`pulumi preview --diff` against what is deployed; Pulumi's diff streams to on_line."""
    result = stack.preview(diff=True, on_output=on_line)
    return Changes({str(op): int(n) for op, n in (result.change_summary or {}).items()})


@dataclass(frozen=True)
class Drift:
    """What `pulumi refresh --preview-only` found between the stack's state and the cloud: resources changed
    outside Pulumi (update) and gone (delete); nothing is written to the state."""

    counts: dict[str, int] = field(default_factory=dict)

    @property
    def drifted(self) -> int:
        return sum(n for op, n in self.counts.items() if op != "same")

    def line(self) -> str:
        changed, gone = self.counts.get("update", 0), self.counts.get("delete", 0)
        if not self.drifted:
            return f"no drift; {self.counts.get('same', 0)} resources as recorded"
        parts = [f"{changed} changed outside Pulumi" if changed else "", f"{gone} gone" if gone else ""]
        others = {op: n for op, n in self.counts.items() if op not in ("update", "delete", "same") and n}
        parts += [f"{n} to {op}" for op, n in sorted(others.items())]
        return ", ".join(p for p in parts if p) + " (pulumi refresh records it; gpuplat up puts it back)"


def drift(stack: AutomationStack, on_line: Line) -> Drift:
    """`pulumi refresh --preview-only`: the cloud read back against the state, the state left as it is."""
    result = stack.refresh(preview_only=True, on_output=on_line)
    changes = getattr(getattr(result, "summary", None), "resource_changes", None) or {}
    return Drift({str(op): int(n) for op, n in changes.items()})


Ask = Callable[[str], bool]


def approve(what: str, *, yes: bool, ask: Ask | None) -> None:
    """Go on with `what` on --yes or the user's yes; no terminal to ask (ask None) refuses (exit 2), a no
    stops with nothing done (exit 4)."""
    if yes:
        return
    if ask is None:
        raise SpecError(
            f"{what}, and there is no terminal to ask for approval: give --yes to go on without asking "
            "(in CI, after reviewing the preview)"
        )
    if not ask(f"{what}. Go on?"):
        raise GpuPlatError("declined: nothing was changed")


def apply(stack: AutomationStack, on_line: Line) -> dict[str, Any]:
    """`pulumi up`; the stack's outputs as plain values."""
    result = stack.up(diff=False, on_output=on_line)
    return plain_outputs(result.outputs)


def destroy(stack: AutomationStack, on_line: Line) -> str:
    result = stack.destroy(on_output=on_line)
    summary = getattr(result, "summary", None)
    deleted = (getattr(summary, "resource_changes", None) or {}).get("delete", 0)
    return f"{deleted} resource(s) deleted ({getattr(summary, 'result', 'unknown')})"


def status(stack: AutomationStack) -> CloudStatus:
    info = stack.info()
    return CloudStatus(
        stack=stack.name,
        last_update=str(info.end_time or info.start_time) if info else None,
        last_result=str(info.result) if info else None,
        resource_changes={
            str(k): int(v) for k, v in ((info.resource_changes if info else None) or {}).items()
        },
        outputs={
            key: "[secret]" if getattr(value, "secret", False) else getattr(value, "value", value)
            for key, value in stack.outputs().items()
        },
    )


def plain_outputs(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The Automation API's outputs (name -> OutputValue(value, secret)) as plain values."""
    return {key: getattr(value, "value", value) for key, value in outputs.items()}


def deployed_stacks() -> list[dict[str, Any]]:
    """The stacks of this project in the Pulumi backend (name, last update, resource count)."""
    if shutil.which("pulumi") is None:
        raise EnvironmentProblem(
            f"listing the deployed stacks asks the Pulumi backend through the Pulumi CLI: install it with "
            f"{INSTALL_PULUMI}. `gpuplat stacks` lists the stack files without it."
        )
    from pulumi import automation

    workspace = automation.LocalWorkspace(work_dir=str(PROJECT_ROOT))
    return [
        {
            "stack": s.name,
            "last_update": str(s.last_update) if s.last_update else None,
            "resources": s.resource_count,
            "update_in_progress": bool(s.update_in_progress),
            "url": s.url,
        }
        for s in workspace.list_stacks()
    ]
