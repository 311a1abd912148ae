"""`gpuplat check`: run the program offline (as `plan` does) and evaluate the policy rules.

Exit 0 when no mandatory rule is violated (advisories are printed), 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.plan.check import check_platform
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.check import CheckReport
from infra.policy.ci_formats import junit, sarif
from infra.policy.config import load_policy_config
from infra.policy.settings import PolicyConfig
from infra.spec.load import stack_file, stack_names

AllFlag = Annotated[bool, typer.Option("--all", help="check every stack in stacks/")]
PolicyConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--policy-config",
        help="policy settings, the format of `pulumi preview --policy-pack-config` (JSON or YAML)",
    ),
]


CheckFormat = Annotated[
    str | None, typer.Option("--format", help="text | json | sarif (code scanning) | junit (test reports)")
]
_FORMATS = ("text", "json", "sarif", "junit")


def _platforms(stack: str | None, stack_file_path: Path | None, every: bool) -> list[ResolvedPlatform]:
    if every:
        if stack or stack_file_path:
            raise SpecError("give --all or a single stack (--stack / --stack-file), not both")
        names = stack_names()
        if not names:
            raise SpecError("no stacks found: stacks/Pulumi.NAME.yaml")
        return [load_platform(stack_file(name)) for name in names]
    return [platform_from_options(stack, stack_file_path)]


def render_check(report: CheckReport) -> None:
    console = output.stdout()
    console.print(
        f"Policy check of stack [bold]{report.stack}[/] (backend {report.backend}, "
        f"{report.resources} resources, {report.source})"
    )
    if report.verdicts:
        console.print(
            output.table(
                "Violations",
                ["rule", "severity", "resource", "message", "remediation"],
                [
                    [escape(cell) for cell in (v.rule, v.severity, v.resource, v.message, v.remediation)]
                    for v in report.verdicts
                ],
            )
        )
    mandatory = len(report.mandatory)
    advisory = len(report.verdicts) - mandatory
    verdict = "passed" if report.passed else "FAILED"
    console.print(f"{report.stack}: {verdict} ({mandatory} mandatory, {advisory} advisory violations)")


def check(
    stack: StackName = None,
    stack_file: StackFile = None,
    every: AllFlag = False,
    policy_config: PolicyConfigFile = None,
    output_format: CheckFormat = None,
    json_output: JsonFlag = False,
) -> None:
    """Check the policy rules offline: the real Pulumi program under the SDK's mocks, no cloud calls."""
    output_format = output.chosen_format(output_format, json_output, _FORMATS)
    config = load_policy_config(policy_config) if policy_config else PolicyConfig()
    platforms = _platforms(stack, stack_file, every)
    reports = [check_platform(platform, config) for platform in platforms]
    if output_format == "json":
        output.print_json([r.to_dict() for r in reports])  # a list, for one stack as for --all
    elif output_format == "sarif":
        pools = [[pool.name for pool in platform.pools] for platform in platforms]
        output.print_json(sarif(zip(reports, pools, strict=True), Path.cwd()))
    elif output_format == "junit":
        sys.stdout.write(junit(reports, config))
    else:
        for report in reports:
            render_check(report)
    fail_on_mandatory({r.stack: {v.rule for v in r.mandatory} for r in reports})


def fail_on_mandatory(rules_by_stack: dict[str, set[str]]) -> None:
    """Exit 1 (one paragraph) when a stack broke a mandatory rule: the verdict `check` and `plan` share."""
    failed = {stack: rules for stack, rules in rules_by_stack.items() if rules}
    if failed:
        summary = "; ".join(f"{stack}: {', '.join(sorted(rules))}" for stack, rules in failed.items())
        raise GpuPlatError(
            f"mandatory policy violations ({summary}). Each line above names the resource, what is wrong "
            "and how to fix it.",
            exit_code=ExitCode.POLICY_VIOLATION,
        )
