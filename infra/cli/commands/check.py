"""`gpuplat check`: run the program offline (as `plan` does) and evaluate the policy rules.

Exit 0 when no mandatory rule is violated (advisories are printed), 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, SetOption, StackFile, StackName, platform_from_options
from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.plan.check import check_platform
from infra.platform.resolve import load_platform
from infra.policy.check import CheckReport, StackProblem
from infra.policy.ci_formats import junit, sarif
from infra.policy.config import load_policy_config
from infra.policy.settings import PolicyConfig
from infra.spec.load import stack_file, stack_names, stacks_dir

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


SarifFile = Annotated[
    Path | None, typer.Option("--sarif", metavar="PATH", help="also write the SARIF report to PATH, whole")
]
JunitFile = Annotated[
    Path | None,
    typer.Option("--junit", metavar="PATH", help="also write the JUnit XML report to PATH, whole"),
]


def _outcomes(
    stack: str | None,
    stack_file_path: Path | None,
    every: bool,
    config: PolicyConfig,
    overrides: list[str] | None = None,
) -> list[CheckReport | StackProblem]:
    """Each stack's report. With --all, a stack whose file does not load is one StackProblem and the others
    are still checked; a single stack that does not load is bad input (exit 2) as everywhere else."""
    if not every:
        return [check_platform(platform_from_options(stack, stack_file_path, overrides), config)]
    if stack or stack_file_path:
        raise SpecError("give --all or a single stack (--stack / --stack-file), not both")
    if overrides:
        raise SpecError("--set sets a value of one stack: give --stack or --stack-file, not --all")
    names = stack_names()
    if not names:
        raise SpecError(f"no stacks found: {stacks_dir()}/Pulumi.NAME.yaml")
    outcomes: list[CheckReport | StackProblem] = []
    for name in names:
        path = stack_file(name)
        try:
            platform = load_platform(path)
        except SpecError as exc:
            outcomes.append(StackProblem(name, str(path), exc.message))
            continue
        outcomes.append(check_platform(platform, config))
    return outcomes


def _write_whole(path: Path, text: str) -> None:
    """Write a report beside its final name, then rename: a reader never sees a half or empty file."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise SpecError(f"{path}: cannot write the report ({exc.strerror})") from exc


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
    sarif_file: SarifFile = None,
    junit_file: JunitFile = None,
    overrides: SetOption = None,
) -> None:
    """Check the policy rules offline: the real Pulumi program under the SDK's mocks, no cloud calls.
    With --all, a stack file that does not load is reported as that stack's error and the others are still
    checked (exit 2 then). --sarif and --junit write those reports in the same run."""
    output_format = output.chosen_format(output_format, json_output, _FORMATS)
    config = load_policy_config(policy_config) if policy_config else PolicyConfig()
    outcomes = _outcomes(stack, stack_file, every, config, overrides)
    reports = [o for o in outcomes if isinstance(o, CheckReport)]
    problems = [o for o in outcomes if isinstance(o, StackProblem)]
    base = Path.cwd()
    if sarif_file is not None:
        _write_whole(sarif_file, json.dumps(sarif(outcomes, base), indent=2) + "\n")
    if junit_file is not None:
        _write_whole(junit_file, junit(outcomes, config, base))
    if output_format == "json":
        output.print_json([o.to_dict() for o in outcomes])  # a list, for one stack as for --all
    elif output_format == "sarif":
        output.print_json(sarif(outcomes, base))
    elif output_format == "junit":
        sys.stdout.write(junit(outcomes, config, base))
    else:
        for outcome in outcomes:
            if isinstance(outcome, CheckReport):
                render_check(outcome)
            else:
                output.stdout().print(f"{outcome.stack}: NOT CHECKED: {outcome.message}", markup=False)
    if problems:
        failed = sorted({r.stack for r in reports if not r.passed})
        raise SpecError(
            f"{len(problems)} stack file(s) could not be checked ({', '.join(p.stack for p in problems)}); "
            f"{len(reports)} checked, {len(failed)} of them with mandatory violations"
            + (f" ({', '.join(failed)})" if failed else "")
            + ". Each is named above with the field to fix."
        )
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
