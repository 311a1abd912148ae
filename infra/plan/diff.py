"""What changes between two revisions of a stack: both recorded offline (the real program under the SDK's
mocks), compared resource by resource (type and name), with the GPUs and the hourly cost before and after.

The base is a stack file or a git revision of the one being planned (`git show REV:stacks/...`)."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from infra.errors import SpecError
from infra.plan.record import Recording, record
from infra.plan.report import full_size_usd_per_hour, recorded_services
from infra.platform.resolve import ResolvedPlatform, load_platform

Operation = Literal["add", "change", "remove"]
_OP_ORDER = {"add": 0, "change": 1, "remove": 2}
MARKDOWN_ROWS = 40  # a pull-request comment stays readable (and under the hosts' size limits)


@dataclass(frozen=True)
class ResourceChange:
    op: Operation
    type: str
    name: str
    fields: tuple[str, ...] = ()  # the inputs that differ, for a change


@dataclass(frozen=True)
class Totals:
    resources: int
    gpus: int
    usd_per_hour: float


@dataclass(frozen=True)
class PlanDiff:
    stack: str
    base: str
    head: str
    before: Totals
    after: Totals
    changes: list[ResourceChange] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {op: sum(1 for c in self.changes if c.op == op) for op in _OP_ORDER}

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "base": self.base,
            "head": self.head,
            "before": asdict(self.before),
            "after": asdict(self.after),
            "counts": self.counts(),
            "changes": [asdict(c) for c in self.changes],
        }


def load_base(stack_path: Path, base: str) -> tuple[ResolvedPlatform | None, str]:
    """The base revision: a stack file, else `base` as a git revision of `stack_path` (None where the file
    did not exist then: everything is new). Unknown revisions and bases that do not parse: exit 2."""
    if Path(base).is_file():
        return load_platform(Path(base)), base
    found = _git(stack_path.parent, "rev-parse", "--show-toplevel")
    repository = found.strip() if found else None
    if repository is None:
        raise SpecError(
            f"--base {base}: not a file, and {stack_path} is not in a git repository to read it from"
        )
    if _git(Path(repository), "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}") is None:
        raise SpecError(
            f"--base {base}: neither a stack file nor a git revision of {repository.strip()} (give a file, "
            "or a branch, tag or commit such as origin/main)"
        )
    relative = stack_path.resolve().relative_to(Path(repository).resolve()).as_posix()
    text = _git(Path(repository), "show", f"{base}:{relative}")
    if text is None:
        return None, f"{base} (no {relative} there)"
    with tempfile.TemporaryDirectory(prefix="gpuplat-base-") as directory:
        copy = Path(directory) / stack_path.name
        copy.write_text(text, encoding="utf-8")
        try:
            return load_platform(copy), f"{base}:{relative}"
        except SpecError as exc:
            raise SpecError(exc.message.replace(str(copy), f"{base}:{relative}")) from exc


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args], capture_output=True, text=True, check=False, timeout=60
        )
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def plan_diff(
    base: ResolvedPlatform | None, head: ResolvedPlatform, base_label: str, head_label: str
) -> PlanDiff:
    before = record(base) if base is not None else Recording()
    after = record(head)
    return PlanDiff(
        stack=head.name,
        base=base_label,
        head=head_label,
        before=_totals(base, before),
        after=_totals(head, after),
        changes=resource_changes(before, after),
    )


def _totals(platform: ResolvedPlatform | None, recording: Recording) -> Totals:
    if platform is None:
        return Totals(0, 0, 0.0)
    usd = full_size_usd_per_hour(platform, recorded_services(recording))
    return Totals(len(recording.resources), platform.total_gpus, usd)


def resource_changes(before: Recording, after: Recording) -> list[ResourceChange]:
    old = {(r.type, r.name): r.inputs for r in before.resources}
    new = {(r.type, r.name): r.inputs for r in after.resources}
    changes = [ResourceChange("add", *key) for key in new.keys() - old.keys()]
    changes += [ResourceChange("remove", *key) for key in old.keys() - new.keys()]
    for key in old.keys() & new.keys():
        differing = sorted(k for k in old[key].keys() | new[key].keys() if old[key].get(k) != new[key].get(k))
        if differing:
            changes.append(ResourceChange("change", *key, fields=tuple(differing)))
    return sorted(changes, key=lambda c: (_OP_ORDER[c.op], c.type, c.name))


def markdown(diff: PlanDiff, limit: int = MARKDOWN_ROWS) -> str:
    """A pull-request comment: the totals, then at most `limit` resource rows."""
    counts = diff.counts()
    b, a = diff.before, diff.after
    lines = [
        f"### gpuplat plan: stack `{diff.stack}`",
        "",
        f"Base `{diff.base}` → head `{diff.head}`: **{counts['add']} to add, {counts['change']} to change, "
        f"{counts['remove']} to remove**",
        "",
        "| | before | after |",
        "|---|---:|---:|",
        f"| resources | {b.resources} | {a.resources} |",
        f"| GPUs at full size | {b.gpus} | {a.gpus} |",
        f"| $/h at full size | {b.usd_per_hour:,.2f} | {a.usd_per_hour:,.2f} |",
        "",
    ]
    if diff.changes:
        lines += ["| change | type | name | inputs |", "|---|---|---|---|"]
        for change in diff.changes[:limit]:
            fields = ", ".join(change.fields[:6]) + (" …" if len(change.fields) > 6 else "")
            lines.append(f"| {change.op} | `{change.type}` | `{change.name}` | {fields} |")
        if len(diff.changes) > limit:
            lines.append(f"\n… and {len(diff.changes) - limit} more (`gpuplat plan --base` prints them all).")
    else:
        lines.append("No resource changes.")
    lines.append(
        "\n<sub>Recorded offline (the program under the Pulumi SDK's mocks); cloud-computed values are not "
        "compared.</sub>"
    )
    return "\n".join(lines) + "\n"
