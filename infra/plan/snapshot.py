"""What `gpuplat plan --base` compares: one stack planned offline, as plain data that crosses a process.

The base revision is planned by its own code: `python -m infra.plan.snapshot STACK_FILE` run in a
worktree of that revision prints this snapshot as JSON (infra/plan/diff.py starts it). The format is
versioned (`FORMAT`): a newer reader refuses a snapshot it does not know rather than misreading it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.plan.record import Recording, record
from infra.plan.report import full_size_usd_per_hour
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.check import verdicts_for
from infra.policy.settings import PolicyConfig

FORMAT = 1
# The checkout this code runs from: the worktree of the base when it plans the base (infra.plan may not
# import infra.spec, whose PROJECT_ROOT is the same directory).
CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class PlanSnapshot:
    stack: str
    gpus: int
    usd_per_hour: float
    resources: dict[str, dict[str, Any]]  # "type name" -> the inputs the program declared
    settings: dict[str, Any]  # the stack file's settings, flattened: "teams[ml].gpu_quota" -> 24
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanSnapshot:
        return cls(**data)


def resource_key(type_token: str, name: str) -> str:
    return f"{type_token} {name}"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted paths; list items that carry a `name` are keyed by it (a team, a pool, a
    dataset), so that one added to a list does not shift the others; other lists are one value."""
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list) and value and all(isinstance(i, dict) and "name" in i for i in value):
        flat = {}
        for item in value:
            flat.update(flatten({k: v for k, v in item.items() if k != "name"}, f"{prefix}[{item['name']}]"))
        return flat
    return {prefix: value}


def _digest(path: Path) -> str:
    """A file's SHA-256, or a directory's over its files' relative paths and contents."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode() if path.is_dir() else b"")
        digest.update(file.read_bytes() if file.exists() else b"(missing)")
    return digest.hexdigest()[:16]


def portable(value: Any) -> Any:
    """Inputs that compare across checkouts: a file asset or archive (recorded by its absolute path, which
    differs between the head and a worktree of the base) by its path in the project and its content's
    digest, so a changed role file shows as a changed value and an unchanged one in another place does not."""
    if isinstance(value, dict):
        kinds = ("FileAsset", "FileArchive")
        if len(value) == 1 and next(iter(value)) in kinds and isinstance(next(iter(value.values())), str):
            kind, location = next(iter(value.items()))
            path = Path(location)
            where = path.relative_to(CHECKOUT).as_posix() if path.is_relative_to(CHECKOUT) else location
            return {kind: where, "sha256": _digest(path)}
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item) for item in value]
    return value


def snapshot(
    platform: ResolvedPlatform, recording: Recording | None = None, config: PolicyConfig | None = None
) -> PlanSnapshot:
    recording = recording or record(platform)
    return PlanSnapshot(
        stack=platform.name,
        gpus=platform.total_gpus,
        usd_per_hour=full_size_usd_per_hour(platform, recording),
        resources={resource_key(r.type, r.name): portable(r.inputs) for r in recording.resources},
        settings=flatten(platform.spec.model_dump(mode="json")),
        verdicts=[v.to_dict() for v in verdicts_for(platform, recording, config)],
    )


def main(arguments: list[str]) -> int:
    if len(arguments) != 1:
        sys.stderr.write("usage: python -m infra.plan.snapshot STACK_FILE\n")
        return 2
    from infra.errors import GpuPlatError

    try:
        document = snapshot(load_platform(Path(arguments[0]))).to_dict()
    except GpuPlatError as exc:
        sys.stderr.write(exc.message + "\n")
        return int(exc.exit_code)
    sys.stdout.write(json.dumps(document, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
