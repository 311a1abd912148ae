"""What changes between two revisions of a stack: both planned offline (the real program under the SDK's
mocks), compared resource by resource (type and name) with each differing input's old and new value, the
stack file's settings that changed (a team's quota, a dataset, serving: some change no resource), the
GPUs and the hourly cost before and after, and the head's policy verdict.

The base is a stack file (planned with the running code) or a git revision: a worktree of that revision
planned by that revision's own code in a process of its own (infra/plan/snapshot.py), so a change to the
program shows as well as a change to the stack file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from infra.errors import SpecError
from infra.plan.snapshot import FORMAT, PlanSnapshot, flatten, snapshot
from infra.platform.resolve import load_platform
from infra.policy.settings import PolicyConfig

Operation = Literal["add", "change", "remove"]
_OP_ORDER = {"add": 0, "change": 1, "remove": 2}
MARKDOWN_ROWS = 40  # a pull-request comment stays readable (and under the hosts' size limits)
VALUE_CHARS = 60  # a value longer than this (user data, a policy document) shows as its length
SNAPSHOT_SECONDS = 600


@dataclass(frozen=True)
class ValueChange:
    field: str
    old: Any
    new: Any


@dataclass(frozen=True)
class ResourceChange:
    op: Operation
    type: str
    name: str
    fields: tuple[str, ...] = ()  # the inputs that differ, for a change
    values: tuple[ValueChange, ...] = ()  # their old and new values, in the order of `fields`


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
    settings: list[ValueChange] = field(default_factory=list)  # field: the setting's dotted path
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # the head's policy findings
    base_code: str = "the base revision's"  # whose program planned the base

    def counts(self) -> dict[str, int]:
        return {op: sum(1 for c in self.changes if c.op == op) for op in _OP_ORDER}

    @property
    def mandatory(self) -> list[dict[str, Any]]:
        return [v for v in self.verdicts if v["severity"] == "mandatory"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "base": self.base,
            "head": self.head,
            "base_code": self.base_code,
            "before": asdict(self.before),
            "after": asdict(self.after),
            "counts": self.counts(),
            "changes": [asdict(c) for c in self.changes],
            "settings": [asdict(s) for s in self.settings],
            "policy": {"passed": not self.mandatory, "verdicts": self.verdicts},
        }


@dataclass(frozen=True)
class Base:
    snapshot: PlanSnapshot | None  # None: the stack did not exist at that revision
    label: str
    code: str = "the base revision's"


def load_base(stack_path: Path, base: str) -> Base:
    """The base revision: a stack file, else `base` as a git revision of `stack_path`'s repository,
    planned in a worktree of it. Unknown revisions and bases that do not parse: exit 2."""
    if Path(base).is_file():
        return Base(snapshot(load_platform(Path(base))), base, "the running")
    repository = _repository(stack_path, base)
    revision = _git(repository, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    if revision is None:
        raise SpecError(
            f"--base {base}: neither a stack file nor a git revision of {repository} (give a file, "
            "or a branch, tag or commit such as origin/main)"
        )
    relative = stack_path.resolve().relative_to(repository.resolve()).as_posix()
    if _git(repository, "cat-file", "-e", f"{revision.strip()}:{relative}") is None:
        return Base(None, f"{base} (no {relative} there)")
    label = f"{base}:{relative}"
    with tempfile.TemporaryDirectory(prefix="gpuplat-base-") as directory:
        tree = Path(directory) / "base"
        if _git(repository, "worktree", "add", "--detach", "--quiet", str(tree), revision.strip()) is None:
            raise SpecError(f"--base {base}: git could not check out {revision.strip()} in {tree}")
        try:
            return _plan_base(tree, relative, label)
        finally:
            _git(repository, "worktree", "remove", "--force", str(tree))


def _repository(stack_path: Path, base: str) -> Path:
    found = _git(stack_path.resolve().parent, "rev-parse", "--show-toplevel")
    if found is None:
        raise SpecError(
            f"--base {base}: not a file, and {stack_path} is not in a git repository to read it from"
        )
    return Path(found.strip())


def _plan_base(tree: Path, relative: str, label: str) -> Base:
    stack = tree / relative
    if not (tree / "infra" / "plan" / "snapshot.py").is_file():
        # The revision holds no program of its own that can plan (a repository of stack files only, or a
        # revision from before snapshots): its stack file is planned with the running code, and said so.
        try:
            return Base(snapshot(load_platform(stack)), label, "the running (the base has no planner)")
        except SpecError as exc:
            raise SpecError(exc.message.replace(str(stack), label)) from exc
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    could_not = f"--base {label}: the base revision's code could not plan it"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "infra.plan.snapshot", str(stack)],
            cwd=tree,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
            timeout=SNAPSHOT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise SpecError(f"{could_not}: it did not finish in {SNAPSHOT_SECONDS} s") from None
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SpecError(f"{could_not}: " + message.replace(str(stack), label))
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise SpecError(f"{could_not}: it printed no plan (a JSON object) on stdout")
    if data.get("format") != FORMAT:
        raise SpecError(
            f"--base {label}: its plan is in format {data.get('format')}, this gpuplat reads {FORMAT}"
        )
    try:
        return Base(PlanSnapshot.from_dict(data), label)
    except TypeError:
        raise SpecError(f"{could_not}: its plan (format {FORMAT}) lacks or adds fields") from None


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args], capture_output=True, text=True, check=False, timeout=120
        )
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def plan_diff(
    base: PlanSnapshot | None, head: PlanSnapshot, base_label: str, head_label: str, base_code: str = ""
) -> PlanDiff:
    return PlanDiff(
        stack=head.stack,
        base=base_label,
        head=head_label,
        before=_totals(base),
        after=_totals(head),
        changes=resource_changes(base.resources if base else {}, head.resources),
        settings=value_changes(base.settings if base else {}, head.settings),
        verdicts=head.verdicts,
        base_code=base_code or "the base revision's",
    )


def head_snapshot(stack_path: Path, config: PolicyConfig) -> PlanSnapshot:
    return snapshot(load_platform(stack_path), config=config)


def _totals(planned: PlanSnapshot | None) -> Totals:
    if planned is None:
        return Totals(0, 0, 0.0)
    return Totals(len(planned.resources), planned.gpus, planned.usd_per_hour)


def value_changes(old: dict[str, Any], new: dict[str, Any]) -> list[ValueChange]:
    """Each key whose value differs, one only on one side included (its other value None), by key."""
    return [
        ValueChange(key, old.get(key), new.get(key))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def resource_changes(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> list[ResourceChange]:
    """`before` and `after` map "type name" to the declared inputs; a nested input differs by its own path
    (`rootBlockDevice.encrypted`), so a comment shows the value that changed, not the whole mapping."""

    def split(key: str) -> tuple[str, str]:
        type_token, name = key.split(" ", 1)
        return type_token, name

    changes = [ResourceChange("add", *split(key)) for key in after.keys() - before.keys()]
    changes += [ResourceChange("remove", *split(key)) for key in before.keys() - after.keys()]
    for key in before.keys() & after.keys():
        values = value_changes(flatten(before[key]), flatten(after[key]))
        if values:
            fields = tuple(v.field for v in values)
            changes.append(ResourceChange("change", *split(key), fields=fields, values=tuple(values)))
    return sorted(changes, key=lambda c: (_OP_ORDER[c.op], c.type, c.name))


def shown(value: Any, limit: int = VALUE_CHARS) -> str:
    """A value for one table cell: JSON, cut to its length when long; absent as `-`."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if len(text) > limit:
        return f"({len(text)} chars)"
    return text.replace("|", "\\|").replace("\n", " ")


def _value_cell(values: tuple[ValueChange, ...], fields_shown: int = 6) -> str:
    cells = [f"{v.field}: `{shown(v.old)}` → `{shown(v.new)}`" for v in values[:fields_shown]]
    return "<br>".join(cells) + (" …" if len(values) > fields_shown else "")


def _policy_lines(diff: PlanDiff) -> list[str]:
    if not diff.verdicts:
        return ["**Policy: passed** (no findings)."]
    mandatory = diff.mandatory
    advisory = len(diff.verdicts) - len(mandatory)
    head = "FAILED" if mandatory else "passed"
    lines = [f"**Policy: {head}** ({len(mandatory)} mandatory, {advisory} advisory findings)", ""]
    lines += ["| severity | rule | resource | finding |", "|---|---|---|---|"]
    for verdict in diff.verdicts[:MARKDOWN_ROWS]:
        message = str(verdict["message"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {verdict['severity']} | `{verdict['rule']}` | `{verdict['resource']}` | {message} |")
    return lines


def markdown(diff: PlanDiff, limit: int = MARKDOWN_ROWS) -> str:
    """A pull-request comment: the totals, the policy verdict, the settings and resource changes with their
    values (at most `limit` rows each)."""
    counts = diff.counts()
    b, a = diff.before, diff.after
    lines = [
        f"### gpuplat plan: stack `{diff.stack}`",
        "",
        f"Base `{diff.base}` → head `{diff.head}`: **{counts['add']} to add, {counts['change']} to change, "
        f"{counts['remove']} to remove**, {len(diff.settings)} setting(s) changed",
        "",
        "| | before | after |",
        "|---|---:|---:|",
        f"| resources | {b.resources} | {a.resources} |",
        f"| GPUs at full size | {b.gpus} | {a.gpus} |",
        f"| $/h at full size | {b.usd_per_hour:,.2f} | {a.usd_per_hour:,.2f} |",
        "",
        *_policy_lines(diff),
        "",
    ]
    if diff.settings:
        lines += ["| setting | before | after |", "|---|---|---|"]
        for setting in diff.settings[:limit]:
            lines.append(f"| `{setting.field}` | `{shown(setting.old)}` | `{shown(setting.new)}` |")
        if len(diff.settings) > limit:
            lines.append(f"\n… and {len(diff.settings) - limit} more settings.")
        lines.append("")
    if diff.changes:
        lines += ["| change | type | name | inputs |", "|---|---|---|---|"]
        for change in diff.changes[:limit]:
            cell = _value_cell(change.values) if change.values else ", ".join(change.fields)
            lines.append(f"| {change.op} | `{change.type}` | `{change.name}` | {cell} |")
        if len(diff.changes) > limit:
            lines.append(f"\n… and {len(diff.changes) - limit} more (`gpuplat plan --base` prints them all).")
    else:
        lines.append("No resource changes.")
    lines.append(
        f"\n<sub>Recorded offline (the program under the Pulumi SDK's mocks); the base planned with "
        f"{diff.base_code} code; cloud-computed values are not compared.</sub>"
    )
    return "\n".join(lines) + "\n"
