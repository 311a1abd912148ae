"""`gpuplat stacks`: one line per stack with backend, pools, GPUs and hourly cost."""

from __future__ import annotations

from typing import Any

from infra.cli import output
from infra.cli.stack_options import JsonFlag
from infra.errors import GpuPlatError
from infra.resolve import load_platform
from infra.spec.load import stack_file, stack_names


def stacks_summary() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in stack_names():
        try:
            platform = load_platform(stack_file(name))
        except GpuPlatError as exc:
            rows.append({"stack": name, "error": exc.message.splitlines()[0]})
            continue
        rows.append(
            {
                "stack": name,
                "backend": platform.spec.backend,
                "pools": len(platform.pools),
                "gpus": platform.total_gpus,
                "usd_per_hour": platform.max_usd_per_hour,
            }
        )
    return rows


def stacks(json_output: JsonFlag = False) -> None:
    """List the stacks in stacks/ with backend, pools, GPUs and hourly cost at full size."""
    rows = stacks_summary()
    if json_output:
        output.print_json(rows)
        return
    table_rows = [
        [
            r["stack"],
            r.get("backend", "invalid"),
            r.get("pools", "-"),
            r.get("gpus", "-"),
            output.usd(r.get("usd_per_hour")) if "usd_per_hour" in r else r.get("error", ""),
        ]
        for r in rows
    ]
    output.stdout().print(
        output.table("Stacks", ["stack", "backend", "pools", "GPUs", "$/h (max)"], table_rows)
    )
