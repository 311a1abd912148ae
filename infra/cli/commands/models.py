"""`gpuplat models`: register a model version in the stack's registry (MLflow) and list what it holds."""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from typing import Annotated

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.errors import SpecError
from infra.platform.resolve import ResolvedPlatform
from infra.serving.registry.locate import open_registry
from infra.serving.registry.mlflow import ModelVersion
from infra.spec.models import REGISTERED_MODEL_PATTERN

models = typer.Typer(
    name="models",
    no_args_is_help=True,
    help="The model registry (MLflow): register versions, list them.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

RegistryUrl = Annotated[
    str | None,
    typer.Option(
        "--registry-url",
        envvar="GPUPLAT_REGISTRY_URL",
        help="the registry's address (default: found on the local platform)",
    ),
]
# MLflow's registered model names are free text; the platform keeps them to what a server name, a
# systemd unit and a Kubernetes object can carry.
MODEL_NAME = re.compile(REGISTERED_MODEL_PATTERN)
ALIAS = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
BUCKET_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$")


@models.command()
def register(
    name: Annotated[str, typer.Argument(metavar="NAME", help="registered model name, e.g. embedder")],
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE", help="the model's files: a path on the shared filesystem or s3://..."
        ),
    ],
    metric: Annotated[
        list[str] | None, typer.Option("--metric", help="evaluation result NAME=VALUE (repeatable)")
    ] = None,
    alias: Annotated[
        list[str] | None, typer.Option("--alias", help="alias to point at it (repeatable)")
    ] = None,
    stack: StackName = None,
    stack_file_path: StackFile = None,
    url: RegistryUrl = None,
    json_output: JsonFlag = False,
) -> None:
    """Register SOURCE as the next version of NAME, with its evaluation metrics and aliases."""
    platform = platform_from_options(stack, stack_file_path)
    check_name(name)
    _check_source(platform, source)
    tags = _metrics(metric or [])
    aliases = [_check_alias(a) for a in alias or []]
    registry = open_registry(platform, url)
    registry.ensure_model(name)
    version = registry.create_version(name, source, tags)
    for each in aliases:
        registry.set_alias(name, each, version.version)
    version = registry.version(name, version.version)
    if json_output:
        output.print_json(_as_json(version))
        return
    named = f" ({', '.join(version.aliases)})" if version.aliases else ""
    output.stdout().print(escape(f"registered {version.reference}{named}: {version.location}"))


@models.command("list")
def list_models(
    name: Annotated[str | None, typer.Argument(metavar="[NAME]", help="one model only")] = None,
    stack: StackName = None,
    stack_file_path: StackFile = None,
    url: RegistryUrl = None,
    json_output: JsonFlag = False,
) -> None:
    """Every version the registry holds (of NAME, or of all models), with aliases and metrics."""
    platform = platform_from_options(stack, stack_file_path)
    if name is not None:
        check_name(name)
    versions = open_registry(platform, url).versions(name)
    if json_output:
        output.print_json([_as_json(v) for v in versions])
        return
    rows = [
        [
            v.name,
            str(v.version),
            ", ".join(v.aliases) or "-",
            ", ".join(f"{k}={val}" for k, val in sorted(v.tags.items())) or "-",
            v.location,
        ]
        for v in versions
    ]
    title = f"model registry of {platform.name}" + ("" if rows else ": empty")
    output.stdout().print(output.table(title, ["model", "version", "aliases", "metrics", "source"], rows))


def _as_json(version: ModelVersion) -> dict[str, object]:
    return asdict(version) | {"aliases": list(version.aliases), "location": version.location}


def check_name(name: str) -> None:
    if not MODEL_NAME.match(name):
        raise SpecError(
            f"model name '{name}': use 1 to 40 lower-case letters, digits and '-', starting and ending "
            "with a letter or digit (it names the model's servers and services)"
        )


def _check_alias(alias: str) -> str:
    if not ALIAS.match(alias) or (alias.startswith("v") and alias[1:].isdigit()) or alias == "latest":
        raise SpecError(
            f"--alias '{alias}': use a lower-case name such as champion or challenger (letters, digits, '_' "
            "and '-'); 'latest' and v<number> are MLflow's own references"
        )
    return alias


def _check_source(platform: ResolvedPlatform, source: str) -> None:
    shared = platform.spec.storage.parallel_fs.mount_path.rstrip("/")
    if BUCKET_URI.match(source):
        return
    if source.startswith("/") and os.path.normpath(source).startswith(shared + "/"):
        return
    raise SpecError(
        f"SOURCE '{source}': give where every inference node can read the model: a path under the shared "
        f"filesystem ({shared}/...) or an object-store URI (s3://bucket/prefix)"
    )


def _metrics(pairs: list[str]) -> dict[str, str]:
    metrics: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not key or number is None:
            raise SpecError(f"--metric '{pair}': write NAME=NUMBER, e.g. --metric accuracy=0.91")
        metrics[key] = repr(number)
    return metrics
