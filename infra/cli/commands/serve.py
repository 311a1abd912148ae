"""`gpuplat serve`: put a registered model version on the stack's model servers, through a canary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.commands.models import RegistryUrl, check_name
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.k8s.serving_versions import ServedVersion
from infra.platform.resolve import ResolvedPlatform
from infra.serving.analysis import PROMOTE_READY, ROLLBACK, Verdict
from infra.serving.carry import GATED, PROMOTED
from infra.serving.detach import check_detachable, detach_guard
from infra.serving.on_kubernetes import KubernetesServing, connect, kubernetes_registry, on_kubernetes
from infra.serving.reach import prometheus_url, stack_reach
from infra.serving.registry.locate import open_registry
from infra.serving.release import (
    CANARY_BACKEND,
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    STABLE_BACKEND,
    Release,
    servable,
)

serve = typer.Typer(
    name="serve",
    no_args_is_help=True,
    help=(
        "Serve registered model versions: deploy one (straight, or as a canary with a share of the requests "
        "and a guard that rolls it back), promote, roll back, show what serves."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)

Model = Annotated[str, typer.Argument(metavar="NAME", help="registered model name")]
PrometheusUrl = Annotated[
    str | None,
    typer.Option(
        "--prometheus-url",
        envvar="GPUPLAT_PROMETHEUS_URL",
        help=(
            "the stack's Prometheus, for each version's p95 (default: found on the local platform, or at an "
            "on-premises controller's address)"
        ),
    ),
]


def _say(line: str) -> None:
    output.stderr().print(escape(line))


def _platform(stack: str | None, stack_file_path: Path | None) -> ResolvedPlatform:
    platform = platform_from_options(stack, stack_file_path)
    # A stack serve cannot drive is refused before the registry is asked for: a registry would not help.
    servable(platform)
    return platform


def _on_kubernetes(platform: ResolvedPlatform) -> KubernetesServing | None:
    """A Kueue stack's release, through its cluster's API (docs/serving.md, On Kubernetes)."""
    return KubernetesServing(platform, connect(platform), _say) if on_kubernetes(platform) else None


def _release(platform: ResolvedPlatform, url: str | None, prometheus: str | None = None) -> Release:
    registry = open_registry(platform, url)
    say = _say

    reach = stack_reach(platform)
    return Release(
        platform,
        registry,
        reach.nodes,
        say,
        prometheus_url(platform, prometheus),
        instances=reach.instances,
        version_record=reach.version_record,
        relist=reach.relist,
    )


@serve.command()
def deploy(
    reference: Annotated[
        str, typer.Argument(metavar="NAME@VERSION|NAME@ALIAS", help="the registered version to serve")
    ],
    canary: Annotated[
        int | None,
        typer.Option(
            "--canary",
            min=1,
            max=99,
            help="give it this share of the requests (percent, 1-99) beside the stable version; without: all",
        ),
    ] = None,
    guard_s: Annotated[
        float,
        typer.Option(
            "--guard-s",
            min=0,
            help="with --canary: analyse it at most this long (serving.canary) and roll it back if it fails",
        ),
    ] = 0,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help=(
                "with --canary: hand the guard to a service on the gateway's node (a Job in the cluster on "
                "a Kueue stack) and return at once; it carries the release after this command ends (`serve "
                "status` shows it)"
            ),
        ),
    ] = False,
    stack: StackName = None,
    stack_file_path: StackFile = None,
    url: RegistryUrl = None,
    prometheus: PrometheusUrl = None,
) -> None:
    """Serve a registered version: as a canary (--canary PERCENT), or on every replica."""
    name = reference.partition("@")[0]
    check_name(name)
    if detach and canary is None:
        raise SpecError("--detach hands a canary's guard to the gateway's node: give --canary PERCENT too")
    platform = _platform(stack, stack_file_path)
    if on_kubernetes(platform):
        _deploy_on_kubernetes(platform, reference, canary, guard_s, detach, url)
        return
    release = _release(platform, url, prometheus)
    if detach:
        check_detachable(release)
    # The registry answers for the version before anything on the nodes is touched, the lock included.
    release.registry.resolve(reference)
    with release.exclusive(name, f"deploy {reference}"):
        version = release.deploy(reference, canary)
        if canary is None:
            output.stdout().print(escape(f"{version.reference} serves every request"))
            return
        output.stdout().print(escape(f"{version.reference} is in canary with {canary} % of the requests"))
        if detach:
            unit = detach_guard(release, version.name, version.reference, canary, guard_s or None)
            output.stdout().print(
                escape(
                    f"its guard runs on as {unit} on {release.layout.gateways[0]}: `gpuplat serve status "
                    f"{version.name}` shows where it stands"
                )
            )
            return
        if guard_s > 0:
            _guard(release, version.name, guard_s)


def _deploy_on_kubernetes(
    platform: ResolvedPlatform,
    reference: str,
    canary: int | None,
    guard_s: float,
    detach: bool,
    url: str | None,
) -> None:
    # The registry answers for the version before the cluster is asked for anything, the lock included.
    version = kubernetes_registry(platform, url).resolve(reference)
    served = ServedVersion(version.reference, version.location)
    kubernetes = _on_kubernetes(platform)
    assert kubernetes is not None
    if canary is not None and detach:
        _detached(kubernetes.deploy_and_detach(served, canary, guard_s or None), reference)
        return
    if canary is not None and guard_s > 0:
        _report(kubernetes.deploy_and_guard(served, canary, guard_s))
        return
    release = kubernetes.deploy(served, canary)
    if release.canary is not None:
        output.stdout().print(
            escape(f"{release.canary.reference} is in canary with {release.canary_percent} % of the requests")
        )
    else:
        output.stdout().print(escape(f"{release.stable.reference} serves every request"))


@serve.command()
def guard(
    model: Model,
    duration_s: Annotated[
        float | None,
        typer.Option(
            "--guard-s",
            min=1,
            help="seconds to watch at most, as deploy's --guard-s (default: interval_s x intervals)",
        ),
    ] = None,
    stack: StackName = None,
    stack_file_path: StackFile = None,
    url: RegistryUrl = None,
    prometheus: PrometheusUrl = None,
    past_gate: Annotated[
        bool,
        typer.Option(
            "--past-gate", help="serving.canary.steps: open the manual gate the release is held at, go on"
        ),
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="on a Kueue stack: hand the guard to a Job in the cluster and return (`serve status`)",
        ),
    ] = False,
) -> None:
    """Analyse NAME's canary against the stable version (serving.canary), or carry it through
    serving.canary.steps (each held for an analysis; a step at 100 % promotes): exit 0 promote-ready,
    promoted, or held at a manual gate; 1 rolled back; 5 no verdict (inconclusive, or --guard-s ended before
    the analysis)."""
    check_name(model)
    platform = _platform(stack, stack_file_path)
    kubernetes = _on_kubernetes(platform)
    if kubernetes is not None and detach:
        _detached(kubernetes.detach_guard(model, duration_s, past_gate), model)
        return
    if kubernetes is not None:
        _report(kubernetes.guard(model, duration_s, past_gate))
        return
    if detach:
        raise SpecError(
            f"stack '{platform.name}' runs on nodes: `gpuplat serve deploy NAME@VERSION --canary P --detach` "
            "starts the guard service on the gateway's node with the canary"
        )
    release = _release(platform, url, prometheus)
    with release.exclusive(model, "guard"):
        _guard(release, model, duration_s, past_gate)


def _detached(job: str, what: str) -> None:
    model = what.partition("@")[0]
    output.stdout().print(
        escape(
            f"the guard of {model} runs on as the Job {job} in the cluster, holding the release's Lease: "
            f"`gpuplat serve status {model}` shows where it stands"
        )
    )


def _guard(release: Release, model: str, duration_s: float | None, past_gate: bool = False) -> None:
    _report(release.guard(model, duration_s, past_gate=past_gate))


def _report(verdict: Verdict) -> None:
    """A guard's verdict, and its exit: 0 promote-ready, promoted or gated; 1 rolled back; 5 none."""
    if verdict.action in (PROMOTED, GATED):
        output.stdout().print(escape(f"{verdict.action}: {verdict.reason}"))
        return
    if verdict.action == ROLLBACK:
        output.stderr().print(escape(f"rolled back: {verdict.reason}"))
        raise typer.Exit(ExitCode.POLICY_VIOLATION)
    if verdict.action != PROMOTE_READY:
        output.stderr().print(escape(f"no verdict to promote on ({verdict.action}): {verdict.reason}"))
        raise typer.Exit(ExitCode.NO_VERDICT)
    output.stdout().print(escape(f"{PROMOTE_READY}: {verdict.reason}"))


@serve.command()
def promote(
    model: Model, stack: StackName = None, stack_file_path: StackFile = None, url: RegistryUrl = None
) -> None:
    """Make NAME's canary the stable version on every replica."""
    check_name(model)
    platform = _platform(stack, stack_file_path)
    kubernetes = _on_kubernetes(platform)
    if kubernetes is not None:
        stable = kubernetes.promote(model).stable
        output.stdout().print(escape(f"{stable.reference} serves every request"))
        return
    release = _release(platform, url)
    with release.exclusive(model, "promote"):
        version = release.promote(model)
    output.stdout().print(escape(f"{version.reference} serves every request"))


@serve.command()
def rollback(
    model: Model, stack: StackName = None, stack_file_path: StackFile = None, url: RegistryUrl = None
) -> None:
    """Take NAME's canary out; with no canary, put the previous stable version back."""
    check_name(model)
    platform = _platform(stack, stack_file_path)
    kubernetes = _on_kubernetes(platform)
    if kubernetes is not None:
        stable = kubernetes.rollback(model).stable
        output.stdout().print(escape(f"{stable.reference} serves every request"))
        return
    release = _release(platform, url)
    with release.exclusive(model, "rollback"):
        serving = release.rollback(model)
    what = serving.reference if serving else "the stack's own model (serving.model)"
    output.stdout().print(escape(f"{what} serves every request"))


@serve.command()
def status(
    model: Model,
    stack: StackName = None,
    stack_file_path: StackFile = None,
    url: RegistryUrl = None,
    prometheus: PrometheusUrl = None,
    json_output: JsonFlag = False,
) -> None:
    """NAME's stable and canary versions: share, requests and failed answers (4xx, 5xx, aborted) at the
    gateways (summed, each since it started), p95 latency over serving.canary.interval_s."""
    check_name(model)
    platform = _platform(stack, stack_file_path)
    kubernetes = _on_kubernetes(platform)
    if kubernetes is not None:
        _status_on_kubernetes(kubernetes, model, json_output)
        return
    release = _release(platform, url, prometheus)
    figures = release.figures()
    try:
        p95 = release.latency_p95(release.rules.interval_s)
    except GpuPlatError as error:
        p95 = dict.fromkeys((STABLE_BACKEND, CANARY_BACKEND))
        output.stderr().print(escape(f"no p95 latencies: {error.message}"))
    roles = {CHAMPION: STABLE_BACKEND, CHALLENGER: CANARY_BACKEND}
    rows = []
    for alias, backend in roles.items():
        version = release.aliased(model, alias)
        share = figures.canary_percent if backend == CANARY_BACKEND else 100 - figures.canary_percent
        rows.append(
            {
                "role": "stable" if alias == CHAMPION else "canary",
                "version": version.reference if version else ("serving.model" if alias == CHAMPION else None),
                "share_percent": share,
                "requests": figures.requests[backend],
                "errors": figures.errors[backend],
                "servers_up": figures.servers_up[backend],
                "p95_ms": None if p95[backend] is None else round(1000 * (p95[backend] or 0), 1),
            }
        )
    previous = release.aliased(model, PREVIOUS)
    replicas = [
        {
            "node": r.node,
            "slot": r.slot,
            "port": r.port,
            "serves": "its GPUs lent to the canary" if r.lent else _served(r.answering, r.version),
        }
        for r in release.replicas_serving()
    ]
    record = release.recorded(model)
    try:
        booted = release.booted_version()
    except GpuPlatError as error:
        booted = None
        output.stderr().print(escape(f"no version record: {error.message}"))
    if json_output:
        output.print_json(
            {
                "model": model,
                "versions": rows,
                "previous": previous.reference if previous else None,
                "replicas": replicas,
                "release": record,
                "booted": booted,
            }
        )
        return
    table = [
        [
            r["role"],
            str(r["version"] or "-"),
            f"{r['share_percent']} %",
            str(r["requests"]),
            str(r["errors"]),
            str(r["servers_up"]),
            "-" if r["p95_ms"] is None else f"{r['p95_ms']:.0f} ms",
        ]
        for r in rows
    ]
    title = f"serving {model} on {release.platform.name}" + (
        f" (previous: {previous.reference})" if previous else ""
    )
    output.stdout().print(
        output.table(title, ["role", "version", "share", "requests", "errors", "servers up", "p95"], table)
    )
    if record is not None:
        output.stdout().print(escape(_record_line("release", record)))
        guard_record = record.get("guard")
        if isinstance(guard_record, dict):
            output.stdout().print(
                escape(
                    f"detached guard: {guard_record.get('state')}, {guard_record.get('step')}, "
                    f"{guard_record.get('looks')} looks (last {guard_record.get('last_look') or '-'}), "
                    f"verdict so far: {(guard_record.get('verdict') or {}).get('action', '-')}"
                )
            )
    output.stdout().print(
        output.table(
            "what each replica serves (its own /metrics)",
            ["node", "slot", "port", "serves"],
            [[r["node"], r["slot"], str(r["port"]), str(r["serves"])] for r in replicas],
        )
    )
    if booted is not None:
        output.stdout().print(
            escape(f"an instance the serving pool starts now serves: {booted or 'serving.model (no record)'}")
        )


def _status_on_kubernetes(kubernetes: KubernetesServing, model: str, json_output: bool) -> None:
    shown = kubernetes.status().as_json(model)
    if json_output:
        output.print_json(shown)
        return
    canary = f", canary {shown['canary']} at {shown['canary_percent']} %" if shown["canary"] else ""
    retiring = f", {shown['retiring']} retiring" if shown["retiring"] else ""
    output.stdout().print(
        escape(f"serving {model} on {kubernetes.platform.name}: stable {shown['stable']}{canary}{retiring}")
    )
    if shown["guard"] is not None:
        job = shown["guard"].get("job_state")
        job_line = f"; its Job: {job}" if job else ""
        output.stdout().print(escape(_record_line("guard", shown["guard"]) + job_line))
    output.stdout().print(
        output.table(
            "what each model-server pod runs",
            ["pod", "version", "image", "model", "ready"],
            [
                [r["pod"], r["version"], r["image"], r["model"], "yes" if r["ready"] else "no"]
                for r in shown["replicas"]
            ],
        )
    )


def _record_line(label: str, record: dict[str, Any]) -> str:
    """A release's (or a guard's) record as one line: its phase, the share, what it said, when and by whom."""
    at_share = "" if record.get("canary_percent") is None else f" at {record['canary_percent']} %"
    return (
        f"{label}: {record.get('phase')}{at_share}: {record.get('detail')} "
        f"({record.get('at')}, {record.get('by')})"
    )


def _served(answering: bool, version: str | None) -> str:
    if not answering:
        return "not answering"
    if version is None:
        return "unknown (its server names no version)"
    return version or "serving.model"
