"""Every Helm values key the Kubernetes layer emits exists in its pinned chart's own defaults.

Helm ignores a values key its chart does not read, so a misspelt one silently does nothing. Each
emitted key path is looked up in the chart's default values.yaml at the pinned release tag (and its
values.schema.json where it has one), stored in tests/data/upstream/helm-values/ (see its SOURCES.md).

A path exists if every mapping key along it is in the defaults. Below a default that is empty
(`{}`, `[]`, null) or a list, or a mapping keyed by label, annotation or file names (a key holding
`/` or `.`, which no template can address as a field), anything is allowed: the chart passes that
value through whole. A subchart vendored in the chart (`<chart>-<version>.<subchart>.yaml`) brings
its defaults under `<subchart>:`, under the parent's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.k8s.facts import host_path_facts
from infra.k8s.objects import HelmRelease
from infra.k8s.operators import KUBERNETES_FILE, kubernetes_data, releases
from infra.platform.resolve import load_platform
from infra.spec.load import stack_file
from tests.conftest import fsx_facts
from tests.upstream import HELM_VALUES

# The shipped stacks with scheduler.kind kueue: the ones the Kubernetes layer builds.
STACKS = ("aws-k8s", "onprem-k8s")

# Keys a chart's templates read at the pinned tag though its values.yaml does not declare them:
# chart key -> key path -> the template that reads it (listed in SOURCES.md too).
TEMPLATE_KEYS: dict[str, dict[tuple[str, ...], str]] = {
    "fsx_csi_driver": {
        ("node", "region"): "charts/aws-fsx-csi-driver/templates/node-daemonset.yaml",
    },
    # The deployment template turns every extraArgs key into a flag (`range $key, $value :=
    # .Values.extraArgs`, cluster-autoscaler/charts/cluster-autoscaler/templates/deployment.yaml:136-140
    # at cluster-autoscaler-chart-9.59.0); the flags are cluster-autoscaler's (FAQ.md, ProvisioningRequest).
    "cluster_autoscaler": {
        (
            "extraArgs",
            "enable-provisioning-requests",
        ): "cluster-autoscaler/charts/cluster-autoscaler/templates/deployment.yaml",
        (
            "extraArgs",
            "kube-api-content-type",
        ): "cluster-autoscaler/charts/cluster-autoscaler/templates/deployment.yaml",
    },
}

# Pinned charts whose values could not be copied from an exact release tag: chart key -> why.
NO_TAG: dict[str, str] = {}

# Emitted keys their chart does not have, not fixed yet: (stack, chart key) -> the key and its emitter.
KNOWN_BAD: dict[tuple[str, str], str] = {}

# A mapping key no template addresses as a field: a label, annotation or file name.
_DATA_KEY = re.compile(r"[./]")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class _Output:
    """Stands in for a Pulumi output: the builders must place it, never read it."""


CLUSTER_NAME = _Output()


@dataclass(frozen=True)
class ChartValues:
    """What a chart declares: its defaults, its schemas (by the key path they apply under), template keys."""

    defaults: dict[str, Any]
    schemas: dict[tuple[str, ...], dict[str, Any]] = field(default_factory=dict)
    template_keys: frozenset[tuple[str, ...]] = frozenset()


# ---- the checker ----


def key_paths(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path to a leaf of `values` (a scalar, a list or an empty mapping)."""
    for key, value in values.items():
        path = (*prefix, str(key))
        if isinstance(value, dict) and value:
            yield from key_paths(value, path)
        else:
            yield path


def free_form(default: Any) -> bool:
    """A default that the chart passes through whole, so that any key below it is the user's."""
    if default is None or isinstance(default, list):
        return True
    return isinstance(default, dict) and (not default or any(_DATA_KEY.search(str(k)) for k in default))


def unknown_in_defaults(path: tuple[str, ...], defaults: Any) -> int | None:
    """Index in `path` of the first key the defaults do not have, or None if the path exists."""
    node = defaults
    for index, key in enumerate(path):
        if free_form(node):
            return None
        if not isinstance(node, dict) or key not in node:
            return index
        node = node[key]
    return None


def _pointer(root: dict[str, Any], ref: str) -> dict[str, Any]:
    """The schema a local `$ref` (`#/a/b`, JSON pointer) names."""
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref is supported, not {ref!r}")
    node: Any = root
    for part in ref[1:].split("/")[1:]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    if not isinstance(node, dict):
        raise ValueError(f"$ref {ref!r} names no schema")
    return node


def _parts(
    node: dict[str, Any], root: dict[str, Any], seen: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """`node` and every schema it must also satisfy: its `$ref` and `allOf`, recursively."""
    found = [node]
    ref = node.get("$ref")
    if isinstance(ref, str) and ref not in seen:
        found += _parts(_pointer(root, ref), root, seen | {ref})
    for part in node.get("allOf", ()):
        found += _parts(part, root, seen)
    return found


def in_schema(path: tuple[str, ...], node: dict[str, Any], root: dict[str, Any]) -> bool:
    """Whether the JSON schema `node` declares `path`: a property, a matching patternProperty,
    additionalProperties, or an object or list whose members it leaves open."""
    if not path:
        return True
    parts = _parts(node, root)
    for part in parts:
        for alternative in (*part.get("anyOf", ()), *part.get("oneOf", ())):
            if in_schema(path, alternative, root):
                return True
    key, rest = path[0], path[1:]
    types: set[str] = set()
    structured = False
    for part in parts:
        kind = part.get("type", ())
        types |= {kind} if isinstance(kind, str) else set(kind)
        properties = part.get("properties") or {}
        patterns = part.get("patternProperties") or {}
        extra = part.get("additionalProperties")
        structured |= bool(properties or patterns or extra is not None or "anyOf" in part or "oneOf" in part)
        if key in properties and in_schema(rest, properties[key], root):
            return True
        if any(re.search(p, key) and in_schema(rest, sub, root) for p, sub in patterns.items()):
            return True
        if extra is True or (isinstance(extra, dict) and in_schema(rest, extra, root)):
            return True
    if "array" in types:
        return True
    return not structured and (not types or "object" in types)


def declared(path: tuple[str, ...], chart: ChartValues) -> bool:
    if unknown_in_defaults(path, chart.defaults) is None:
        return True
    if any(path[: len(key)] == key for key in chart.template_keys):
        return True
    return any(
        path[: len(prefix)] == prefix and in_schema(path[len(prefix) :], schema, schema)
        for prefix, schema in chart.schemas.items()
    )


def dotted(path: tuple[str, ...]) -> str:
    """`a.b["gpuplat/role"]`: a key that is not a field name is quoted."""
    text = ""
    for key in path:
        text += (f".{key}" if text else key) if _FIELD.fullmatch(key) else f"[{json.dumps(key)}]"
    return text


def undeclared(values: dict[str, Any], chart: ChartValues) -> list[str]:
    """The key paths of `values` the chart does not declare, each with its first unknown key."""
    bad = []
    for path in key_paths(values):
        if not declared(path, chart):
            index = unknown_in_defaults(path, chart.defaults)
            bad.append(
                f"{dotted(path)} (no {path[index or 0]!r} at {dotted(path[: index or 0]) or 'top level'})"
            )
    return bad


# ---- the charts' defaults ----


def values_dir() -> Path:
    if not (HELM_VALUES / "SOURCES.md").is_file():
        pytest.fail(f"no chart default values at {HELM_VALUES} (its SOURCES.md is missing)")
    return HELM_VALUES


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a subchart's defaults (`base`) with the parent's values for it (`over`)."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, dict):
            value = _merged(below, value)
        merged[key] = value
    return merged


def chart_values(key: str, version: str) -> ChartValues:
    """The stored defaults of chart `key` (kubernetes.yaml's `charts:` key) at `version`."""
    directory = values_dir()
    stem = f"{key}-{version}"
    path = directory / f"{stem}.yaml"
    if not path.is_file():
        if key in NO_TAG:
            pytest.skip(f"chart {key} {version}: {NO_TAG[key]}")
        pytest.fail(
            f"chart {key} {version} (pinned in {KUBERNETES_FILE}) has no default values at {path}: copy "
            "values.yaml from the chart's release tag and list it in SOURCES.md"
        )
    defaults = yaml.safe_load(path.read_text()) or {}
    schemas: dict[tuple[str, ...], dict[str, Any]] = {}
    schema = directory / f"{stem}.schema.json"
    if schema.is_file():
        schemas[()] = json.loads(schema.read_text())
    for sub in sorted(directory.glob(f"{stem}.*.yaml")):
        name = sub.name[len(stem) + 1 : -len(".yaml")]
        defaults[name] = _merged(yaml.safe_load(sub.read_text()) or {}, defaults.get(name) or {})
        sub_schema = directory / f"{stem}.{name}.schema.json"
        if sub_schema.is_file():
            schemas[(name,)] = json.loads(sub_schema.read_text())
    return ChartValues(defaults, schemas, frozenset(TEMPLATE_KEYS.get(key, {})))


def pinned_charts() -> dict[str, tuple[str, str]]:
    """Chart key -> (chart reference, version), as pinned in kubernetes.yaml."""
    charts = kubernetes_data().charts
    pinned = {key: getattr(charts, key) for key in type(charts).model_fields}
    return {key: (chart.chart, chart.version) for key, chart in pinned.items()}


def chart_key(release: HelmRelease) -> str:
    (key,) = [k for k, pin in pinned_charts().items() if pin == (release.chart, release.version)]
    return key


@cache
def emitted(stack: str) -> dict[str, HelmRelease]:
    """Chart key -> the release the Kubernetes layer builds for the shipped `stack`."""
    platform = load_platform(stack_file(stack))
    k8s = platform.spec.kubernetes
    eks = k8s is not None and k8s.distribution == "eks"
    facts = fsx_facts(CLUSTER_NAME) if eks else host_path_facts(platform)
    return {chart_key(release): release for release in releases(platform, facts)}


def _cases() -> list[Any]:
    cases = []
    for stack in STACKS:
        for key in emitted(stack):
            bad = KNOWN_BAD.get((stack, key))
            marks = [pytest.mark.xfail(strict=True, reason=bad)] if bad else []
            cases.append(pytest.param(stack, key, id=f"{stack}-{key}", marks=marks))
    return cases


# ---- the tests ----


@pytest.mark.parametrize(("stack", "key"), _cases())
def test_emitted_values_exist_in_the_chart(stack: str, key: str) -> None:
    release = emitted(stack)[key]
    bad = undeclared(release.values, chart_values(key, release.version))
    assert not bad, (
        f"{stack}: release {release.name!r} of chart {key} ({release.chart} {release.version}) sets keys "
        f"its chart's values.yaml does not have (Helm ignores them): {'; '.join(bad)}"
    )


def test_every_pinned_chart_is_checked() -> None:
    """Each chart in kubernetes.yaml is emitted by a shipped stack and has its defaults stored."""
    checked = {key for stack in STACKS for key in emitted(stack)}
    assert checked == set(pinned_charts()), "pinned charts no shipped stack emits, so none is checked"
    directory = values_dir()
    for key, (_, version) in pinned_charts().items():
        assert key in NO_TAG or (directory / f"{key}-{version}.yaml").is_file(), (key, version)


def test_template_keys_are_recorded_in_sources() -> None:
    sources = (values_dir() / "SOURCES.md").read_text()
    for key, paths in TEMPLATE_KEYS.items():
        for path, template in paths.items():
            row = re.compile(
                rf"^\| {re.escape(key)} \| {re.escape('.'.join(path))} \| {re.escape(template)}\b", re.M
            )
            assert row.search(sources), (key, path, template)


# The rules on a miniature chart.
_MINI = ChartValues(
    defaults={
        "controllerManager": {"nodeSelector": {}, "tolerations": [], "replicas": 1},
        "operator": {"nodeSelector": {"kubernetes.io/os": "linux"}, "image": {"tag": "v1"}},
        "config": None,
        "enabled": True,
    },
    schemas={
        (): {
            "type": "object",
            "$defs": {"labels": {"type": "object", "additionalProperties": {"type": "string"}}},
            "properties": {
                "extra": {"type": "object", "properties": {"known": {"type": "string"}}},
                "labels": {"$ref": "#/$defs/labels"},
                "open": {"type": "object"},
            },
        }
    },
    template_keys=frozenset({("node", "region")}),
)


@pytest.mark.parametrize(
    "values",
    [
        {"controllerManager": {"nodeSelector": {"gpuplat/role": "service"}, "tolerations": [{"key": "a"}]}},
        {"controllerManager": {"replicas": 2}},
        {"operator": {"nodeSelector": {"gpuplat/role": "service"}}},
        {"config": {"anything": {"below": 1}}},
        {"extra": {"known": "x"}, "labels": {"a/b": "c"}, "open": {"x": {"y": 1}}},
        {"node": {"region": "us-east-1"}},
    ],
)
def test_checker_accepts_declared_and_free_form_keys(values: dict[str, Any]) -> None:
    assert undeclared(values, _MINI) == []


@pytest.mark.parametrize(
    ("values", "bad"),
    [
        (
            {"controllerManger": {"nodeSelector": {"gpuplat/role": "x"}}},
            'controllerManger.nodeSelector["gpuplat/role"]',
        ),
        ({"controllerManager": {"replica": 2}}, "controllerManager.replica"),
        ({"operator": {"image": {"tags": "v2"}}}, "operator.image.tags"),
        ({"enabled": {"really": True}}, "enabled.really"),
        ({"extra": {"unknown": "x"}}, "extra.unknown"),
        ({"node": {"regoin": "us-east-1"}}, "node.regoin"),
    ],
)
def test_checker_rejects_misspelt_keys(values: dict[str, Any], bad: str) -> None:
    (found,) = undeclared(values, _MINI)
    assert found.startswith(f"{bad} ("), found


def test_checker_rejects_a_misspelt_kueue_key() -> None:
    """The kueue release with controllerManager misspelt fails against the real kueue defaults."""
    release = emitted("aws-k8s")["kueue"]
    chart = chart_values("kueue", release.version)
    assert undeclared(release.values, chart) == []
    misspelt = {"controllerManger" if k == "controllerManager" else k: v for k, v in release.values.items()}
    bad = undeclared(misspelt, chart)
    assert bad and all(path.startswith("controllerManger.") for path in bad), bad
    nested = {**release.values, "managerConfig": {"controllerManagerConfigYml": "x"}}
    assert undeclared(nested, chart) == [
        "managerConfig.controllerManagerConfigYml (no 'controllerManagerConfigYml' at managerConfig)"
    ]
