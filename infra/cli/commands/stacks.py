"""`gpuplat stacks`: one line per stack with backend, pools, GPUs and hourly cost; invalid stacks exit 2."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag
from infra.errors import GpuPlatError, SpecError
from infra.plan.report import full_size_usd_per_hour
from infra.platform.resolve import load_platform
from infra.spec.load import stack_file, stack_names


def stacks_summary() -> tuple[list[dict[str, Any]], list[GpuPlatError]]:
    """A row per stack (an invalid one with its first problem) and the errors of the invalid ones."""
    rows: list[dict[str, Any]] = []
    errors: list[GpuPlatError] = []
    for name in stack_names():
        try:
            platform = load_platform(stack_file(name))
        except GpuPlatError as exc:
            errors.append(exc)
            rows.append({"stack": name, "error": _first_problem(exc.message)})
            continue
        rows.append(
            {
                "stack": name,
                "backend": platform.spec.backend,
                "pools": len(platform.pools),
                "gpus": platform.total_gpus,
                "usd_per_hour": full_size_usd_per_hour(platform),  # as `gpuplat plan` counts it
            }
        )
    return rows, errors


def _first_problem(message: str) -> str:
    """The first field and problem of a spec error (its second line), else its first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else lines[0] if lines else ""


def stacks(json_output: JsonFlag = False) -> None:
    """List the stacks in stacks/ with backend, pools, GPUs and hourly cost at full size (the pools and the
    services the program declares, as `gpuplat plan` counts them)."""
    rows, errors = stacks_summary()
    if json_output:
        output.print_json(rows)
    else:
        table_rows = [
            [
                r["stack"],
                r.get("backend", "invalid"),
                r.get("pools", "-"),
                r.get("gpus", "-"),
                output.usd(r.get("usd_per_hour")) if "usd_per_hour" in r else escape(r.get("error", "")),
            ]
            for r in rows
        ]
        output.stdout().print(
            output.table("Stacks", ["stack", "backend", "pools", "GPUs", "$/h (max)"], table_rows)
        )
    if errors:
        noun = "stack file is" if len(errors) == 1 else "stack files are"
        raise SpecError(f"{len(errors)} {noun} invalid:\n" + "\n".join(e.message for e in errors))
