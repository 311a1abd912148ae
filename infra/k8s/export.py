"""The Kubernetes layer of a recording as files a GitOps tool (Argo CD, Flux) or `kubectl` applies:
the same objects `pulumi up` creates, read back from the recorded pulumi-kubernetes inputs.

Layout of the directory:
  operators/helmfile.yaml, operators/<release>.values.yaml   the Helm releases, installed first
  nodes.yaml                                                 labels and taints of existing nodes
                                                             (kubectl apply --server-side)
  00-namespaces.yaml, 10-cluster.yaml, 20-<namespace>.yaml   the objects, in apply order
  kustomization.yaml                                         `kubectl apply -k` of the object files
  examples/<team>-jobset.yaml                                a training job per team (not applied)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from infra.k8s.objects import Manifest

CHART_TYPE = "kubernetes:helm.sh/v4:Chart"
CONFIG_FILE_TYPE = "kubernetes:yaml/v2:ConfigFile"
# What the offline recording's mocks answer for values a cloud computes at deployment (ids, DNS names).
_MOCK_VALUE = re.compile(r"(-id$|\.mock\.amazonaws\.com|^mockmnt$|^arn:aws:mock:)")


class _Dumper(yaml.SafeDumper):
    """Block style, keys in the objects' own order (apiVersion, kind, metadata, spec)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_all(documents: Iterable[Any]) -> str:
    return yaml.dump_all(list(documents), Dumper=_Dumper, sort_keys=False, default_flow_style=False)


@dataclass(frozen=True)
class RecordedChart:
    name: str
    inputs: dict[str, Any]
    crd_urls: tuple[str, ...] = ()
    """CRDs applied before the chart (HelmRelease.crd_urls): a presync hook of its helmfile release."""


def _ordered(manifest: Manifest) -> Manifest:
    head: dict[str, Any] = {k: manifest[k] for k in ("apiVersion", "kind", "metadata") if k in manifest}
    return {**head, **{k: v for k, v in manifest.items() if k not in head}}


def _file_for(manifest: Manifest) -> str:
    if manifest["kind"] == "Namespace":
        return "00-namespaces.yaml"
    namespace = manifest["metadata"].get("namespace")
    return f"20-{namespace}.yaml" if namespace else "10-cluster.yaml"


def _helmfile(charts: list[RecordedChart]) -> tuple[str, dict[str, str]]:
    repositories: dict[str, str] = {}
    releases = []
    values_files: dict[str, str] = {}
    # helmfile installs releases in parallel unless one `needs` another (helmfile docs, "DAG-aware
    # installation/deletion ordering with needs"): every release waits for those before it that apply
    # CRDs, whose APIs a controller may look for only when it starts (KubernetesPlatform._chart).
    with_crds: list[str] = []
    for chart in charts:
        inputs = chart.inputs
        reference = str(inputs["chart"])
        repo = (inputs.get("repositoryOpts") or {}).get("repo")
        if repo:
            repositories[chart.name] = str(repo)
            reference = f"{chart.name}/{reference}"
        values_file = f"{chart.name}.values.yaml"
        values_files[values_file] = dump_all([inputs.get("values") or {}])
        release: dict[str, Any] = {
            "name": chart.name,
            "namespace": inputs.get("namespace"),
            "chart": reference,
            "version": inputs.get("version"),
            "values": [values_file],
        }
        if with_crds:
            release["needs"] = list(with_crds)
        if chart.crd_urls:
            with_crds.append(f"{inputs.get('namespace')}/{chart.name}")
            # helmfile runs a release's presync hooks before it installs it (helmfile docs, "Hooks").
            release["hooks"] = [
                {
                    "events": ["presync"],
                    "showlogs": True,
                    "command": "kubectl",
                    "args": ["apply", "--server-side", "-f", url],
                }
                for url in chart.crd_urls
            ]
        releases.append(release)
    document: dict[str, Any] = {}
    if repositories:
        document["repositories"] = [{"name": n, "url": u} for n, u in sorted(repositories.items())]
    document["releases"] = releases
    return dump_all([document]), values_files


def mock_values(files: dict[str, str]) -> list[str]:
    """`file: value` for every value in the files that the offline recording made up."""
    found = []
    for name, text in sorted(files.items()):
        for document in yaml.safe_load_all(text):
            for value in _strings(document):
                if _MOCK_VALUE.search(value):
                    found.append(f"{name}: {value}")
    return sorted(set(found))


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def manifest_files(
    objects: list[Manifest],
    patches: list[Manifest],
    charts: list[RecordedChart],
    examples: dict[str, Manifest],
) -> dict[str, str]:
    """Relative path -> file content."""
    by_file: dict[str, list[Manifest]] = {}
    for manifest in objects:
        by_file.setdefault(_file_for(manifest), []).append(_ordered(manifest))
    files = {name: dump_all(documents) for name, documents in sorted(by_file.items())}
    files["kustomization.yaml"] = dump_all(
        [
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": sorted(by_file),
            }
        ]
    )
    if patches:
        files["nodes.yaml"] = dump_all(_ordered(p) for p in patches)
    if charts:
        helmfile, values = _helmfile(charts)
        files["operators/helmfile.yaml"] = helmfile
        files |= {f"operators/{name}": text for name, text in values.items()}
    files |= {f"examples/{name}": dump_all([_ordered(m)]) for name, m in sorted(examples.items())}
    return files
