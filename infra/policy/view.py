"""A neutral view of one resource (type, name, props, parent), whoever declared it.

Two sources feed it: the offline recording (`infra.plan.record`, the SDK mocks) and CrossGuard
(`pulumi_policy` validation args). Both carry the provider's property names (camelCase), so the rules
read one shape. This module imports neither Pulumi nor pulumi_policy: converters take duck-typed objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

# The tags the pools set (one definition, with the inventory that finds nodes by them). A Slurm-managed
# training pool's size range is on its launch template: Slurm, not an Auto Scaling group, scales it.
from infra.nodes.inventory import TAG_MAX_NODES, TAG_MIN_NODES, TAG_POOL, TAG_ROLE

__all__ = [
    "TAG_MAX_NODES",
    "TAG_MIN_NODES",
    "TAG_POOL",
    "TAG_ROLE",
    "UNKNOWN",
    "ResourceIndex",
    "ResourceView",
    "from_policy_args",
    "from_policy_resource",
    "from_recorded",
    "plain",
]

_T = TypeVar("_T")

# What an unknown value (preview: not computed yet) becomes in a view.
UNKNOWN = "<unknown>"
_UNKNOWN_SENTINELS = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",
        "030794c1-ac77-496b-92df-f27374a8bd58",
        "e48ece36-62e2-4504-bad9-02848725956a",
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",
    }
)


@dataclass(frozen=True)
class ResourceView:
    """One resource as the rules see it.

    `ids` are the values other resources use to refer to this one (its id, arn and physical name when
    known; under the SDK mocks the id is `<name>-id` and the name the logical name); `dependencies`
    maps a top-level property to the URNs it depends on, where the engine says so (CrossGuard stack
    validation).
    """

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    parent: str | None = None
    ids: frozenset[str] = frozenset()
    dependencies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def parent_name(self) -> str | None:
        return self.parent.rsplit("::", 1)[-1] if self.parent else None

    @property
    def label(self) -> str:
        return self.name

    def tags(self) -> dict[str, str]:
        """The resource's tags: a mapping (most AWS resources) or a list of {key, value} (Auto Scaling)."""
        raw = self.props.get("tags")
        if isinstance(raw, Mapping):
            return {str(k): str(v) for k, v in raw.items()}
        if isinstance(raw, list):
            return {
                str(item["key"]): str(item.get("value", ""))
                for item in raw
                if isinstance(item, Mapping) and "key" in item
            }
        return {}

    def tag(self, key: str) -> str | None:
        return self.tags().get(key)


class _Recorded(Protocol):
    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def urn(self) -> str: ...
    @property
    def inputs(self) -> dict[str, Any]: ...
    @property
    def parent_urn(self) -> str | None: ...


def _mock_ids(name: str, props: Mapping[str, Any]) -> frozenset[str]:
    """The values that may refer to a resource: its id, arn and physical name where the props carry them,
    `<name>-id` (the SDK mocks' id) and its logical name. Under the SDK mocks (the offline recording, and
    views built from it) a resource's `name` output is its logical name, so a reference by name (a
    launch template's placement group) holds that; in a real stack the engine's property dependencies
    or the physical name in the props resolve it."""
    ids = {f"{name}-id", name}
    for key in ("id", "arn", "name"):
        value = props.get(key)
        if isinstance(value, str) and value and value != UNKNOWN:
            ids.add(value)
    return frozenset(ids)


def from_recorded(resource: _Recorded) -> ResourceView:
    """A view of a resource recorded offline (`infra.plan.record.RecordedResource`)."""
    return ResourceView(
        type=resource.type,
        name=resource.name,
        props=resource.inputs,
        urn=resource.urn,
        parent=resource.parent_urn,
        ids=_mock_ids(resource.name, resource.inputs),
    )


def plain(value: Any) -> Any:
    """Unwrap pulumi_policy's unknown-checking proxies into plain data; unknowns become `UNKNOWN`."""
    if isinstance(value, Mapping):
        target = _target(value)
        return {str(k): plain(v) for k, v in target.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        target = _target(value)
        return [plain(v) for v in target]
    if isinstance(value, str) and value in _UNKNOWN_SENTINELS:
        return UNKNOWN
    return value


def _target(proxy: Any) -> Any:
    """The wrapped container of a pulumi_policy proxy (reading it does not raise on unknowns)."""
    try:
        return proxy["__target"]
    except (KeyError, IndexError, TypeError):
        return proxy


def from_policy_args(args: Any) -> ResourceView:
    """A view of a CrossGuard `ResourceValidationArgs`."""
    props = plain(args.props)
    opts = getattr(args, "opts", None)
    return ResourceView(
        type=args.resource_type,
        name=args.name,
        props=props,
        urn=args.urn,
        parent=getattr(opts, "parent", None) or None,
        ids=_mock_ids(args.name, props),
    )


def from_policy_resource(resource: Any) -> ResourceView:
    """A view of a CrossGuard `PolicyResource` (stack validation), with its property dependencies."""
    props = plain(resource.props)
    parent = getattr(resource, "parent", None)
    opts = getattr(resource, "opts", None)
    dependencies = {
        str(key): tuple(dep.urn for dep in deps)
        for key, deps in (getattr(resource, "property_dependencies", None) or {}).items()
    }
    return ResourceView(
        type=resource.resource_type,
        name=resource.name,
        props=props,
        urn=resource.urn,
        parent=parent.urn if parent is not None else (getattr(opts, "parent", None) or None),
        ids=_mock_ids(resource.name, props),
        dependencies=dependencies,
    )


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


class ResourceIndex:
    """The resources of one stack, with lookups by URN, by id and by the references between them."""

    def __init__(self, resources: Iterable[ResourceView]) -> None:
        self.resources = list(resources)
        self._by_urn = {r.urn: r for r in self.resources if r.urn}
        # one value may name several resources (a logical name shared across types): keep them all and
        # let the caller's type filter choose
        self._by_id: dict[str, list[ResourceView]] = {}
        for resource in self.resources:
            for identifier in resource.ids:
                self._by_id.setdefault(identifier, []).append(resource)
        self._derived: dict[str, tuple[object, Any]] = {}

    def __iter__(self) -> Iterator[ResourceView]:
        return iter(self.resources)

    def of_type(self, *types: str) -> list[ResourceView]:
        return [r for r in self.resources if r.type in types]

    def by_urn(self, urn: str) -> ResourceView | None:
        return self._by_urn.get(urn)

    def referenced(self, resource: ResourceView, *keys: str, type_: str | None = None) -> list[ResourceView]:
        """Resources that the given top-level properties of `resource` refer to (by id or dependency)."""
        found: dict[str, ResourceView] = {}
        for key in keys:
            for urn in resource.dependencies.get(key, ()):
                target = self._by_urn.get(urn)
                if target is not None:
                    found[target.urn or target.name] = target
            for value in _strings(resource.props.get(key)):
                for target in self._by_id.get(value, ()):
                    if target is not resource:
                        found[target.urn or target.name] = target
        result = list(found.values())
        return [r for r in result if type_ is None or r.type == type_]

    def derived(self, key: str, depends_on: object, compute: Callable[[], _T]) -> _T:
        """What several rules derive from these resources (the node groups), computed once per index: kept
        under `key` with what else it was computed from (`depends_on`, the stack's platform), and computed
        again when asked with something else. An index holds one stack's resources and lives for one check."""
        held = self._derived.get(key)
        if held is None or held[0] is not depends_on:
            held = (depends_on, compute())
            self._derived[key] = held
        value: _T = held[1]
        return value

    def refers_to(self, resource: ResourceView, target: ResourceView, *keys: str) -> bool:
        return any(r is target for r in self.referenced(resource, *keys))
