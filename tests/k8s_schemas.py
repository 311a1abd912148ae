"""Strict offline validation of Kubernetes objects, for tests: would the API server accept this manifest?

- Built-in kinds: the strict JSON schemas kubernetes-validate bundles for each minor version (an unknown
  field, kind or apiVersion is an error).
- Custom resources: the served version's openAPIV3Schema from the CRDs in the shared folder, made strict
  (unknown fields fail), with the API server's defaulting, list-type uniqueness and the CRD's CEL rules
  (`x-kubernetes-validations`) evaluated by celpy.
- Every object: the ObjectMeta checks the API server makes in Go (name, namespace, label and annotation
  syntax).
- ValidatingAdmissionPolicy: `compile_cel` and `evaluate_admission` run a policy's CEL on an object.

CEL that celpy cannot parse or run (Kubernetes library functions it lacks, optional types) is reported as
not evaluated, never as passed.
"""

from __future__ import annotations

import base64
import copy
import functools
import importlib.resources
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy
import celpy.celtypes as cel
import jsonschema  # type: ignore[import-untyped]
import pytest
import re2  # type: ignore[import-untyped]
import yaml
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions
from kubernetes_validate.utils import all_versions, major_minor
from lark import Token, Tree
from referencing import Registry, Resource

from infra.k8s.objects import NAMESPACE_NAME_LABEL
from tests.upstream import CRDS

Schema = dict[str, Any]

CRD_DIRECTORY_ENV = "GPUPLAT_K8S_CRDS"
REPOSITORY = Path(__file__).resolve().parents[1]

# kubernetes-validate 1.37.0 names its bundled schema folders v<minor>.0-local-strict.
_SCHEMA_PACKAGE_FOLDER = "kubernetes-json-schema"
_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"
_OBJECT_META_REF = f"{_DEFINITIONS_ID}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class NotEvaluated:
    path: str
    rule: str
    reason: str

    @property
    def transition_rule(self) -> bool:
        return self.reason.startswith(_TRANSITION_REASON)


@dataclass
class CelCounts:
    evaluated: int = 0
    passed: int = 0
    failed: int = 0
    not_evaluated: list[NotEvaluated] = field(default_factory=list)


@dataclass
class Report:
    object: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cel: CelCounts = field(default_factory=CelCounts)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{self.object}: {path}: {message}")


class CrdDirectoryMissing(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------- entry points


def crd_directory() -> Path:
    configured = os.environ.get(CRD_DIRECTORY_ENV)
    return Path(configured) if configured else CRDS


def require_crds() -> Path:
    """The CRD folder, for tests that need it: a missing one fails the test."""
    directory = crd_directory()
    if not directory.is_dir():
        pytest.fail(f"CRD folder {directory} is missing (set {CRD_DIRECTORY_ENV} to point elsewhere)")
    return directory


def validate(manifest: Mapping[str, Any], kubernetes_version: str = "1.34") -> Report:
    """Check `manifest` as the API server of `kubernetes_version` would on create."""
    minor = _supported_minor(kubernetes_version)
    report = Report(_describe(manifest))
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
        report.error("$", "apiVersion and kind are required strings")
        return report
    group, _, version = api_version.rpartition("/")
    builtin = _builtin_validator(minor, group, version, kind)
    if builtin is not None:
        _collect_schema_errors(builtin, manifest, report)
        _check_metadata(manifest, _builtin_name_rule(kind), namespaced=None, report=report)
        if kind == "ValidatingAdmissionPolicy":
            _check_policy_expressions(manifest, report)
        return report
    # A core (group-less) kind is built in or nothing: no CRD can define one.
    crd = _crd_index(str(_existing_crd_directory())).get((group, kind)) if group else None
    if crd is None:
        report.error(
            "$",
            f"no schema for {api_version} {kind}: not a built-in kind of Kubernetes {minor} "
            f"and no CRD for it in {crd_directory()}",
        )
        return report
    _validate_custom_resource(crd, version, manifest, minor, report)
    return report


def assert_accepted(manifest: Mapping[str, Any], kubernetes_version: str = "1.34") -> Report:
    """Fail the test unless the API server would accept `manifest` and every CEL rule it meets, transition
    rules aside (the API server runs those on update only), was evaluated."""
    report = validate(manifest, kubernetes_version)
    unevaluated = [n for n in report.cel.not_evaluated if not n.transition_rule]
    problems = report.errors + [
        f"{report.object}: {n.path}: not evaluated: {n.rule!r}: {n.reason}" for n in unevaluated
    ]
    assert not problems, "\n".join(problems)
    return report


# ----------------------------------------------------------------------------------- built-in kinds


def _supported_minor(kubernetes_version: str) -> str:
    minor: str = major_minor(kubernetes_version.removeprefix("v"))
    supported = [major_minor(v) for v in all_versions()]
    if minor not in supported:
        raise ValueError(f"Kubernetes {kubernetes_version}: kubernetes-validate has schemas for {supported}")
    return minor


@functools.cache
def _schema_folder(minor: str) -> Any:
    return (
        importlib.resources.files("kubernetes_validate") / _SCHEMA_PACKAGE_FOLDER / f"v{minor}.0-local-strict"
    )


@functools.cache
def _definitions_registry(minor: str) -> Registry[Any]:
    definitions = json.loads((_schema_folder(minor) / "_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


@functools.cache
def _builtin_validator(
    minor: str, group: str, version: str, kind: str
) -> jsonschema.Draft202012Validator | None:
    """The strict schema of a built-in kind, None when Kubernetes `minor` has no such group/version/kind.

    The file name keeps only the group's first label (kubernetes-validate's layout), so the schema's own
    x-kubernetes-group-version-kind decides: apps.example.com/v1 Deployment is not apps/v1 Deployment."""
    file_group = f"{group.split('.')[0]}-" if group else ""
    path = _schema_folder(minor) / f"{kind.lower()}-{file_group}{version}.json"
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    wanted = {"group": group, "version": version, "kind": kind}
    if wanted not in schema.get("x-kubernetes-group-version-kind", []):
        return None
    return jsonschema.Draft202012Validator(schema, registry=_definitions_registry(minor))


def _collect_schema_errors(validator: jsonschema.Draft202012Validator, instance: Any, report: Report) -> None:
    for error in sorted(validator.iter_errors(instance), key=lambda e: e.json_path):
        report.error(error.json_path, error.message)


# ---------------------------------------------------------------------------------- custom resources


@dataclass(frozen=True)
class _Crd:
    group: str
    kind: str
    scope: str
    versions: dict[str, Schema]
    source: Path


def _existing_crd_directory() -> Path:
    directory = crd_directory()
    if not directory.is_dir():
        raise CrdDirectoryMissing(f"CRD folder {directory} is missing (set {CRD_DIRECTORY_ENV})")
    return directory


@functools.cache
def _crd_index(directory: str) -> dict[tuple[str, str], _Crd]:
    index: dict[tuple[str, str], _Crd] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        for document in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader):
            if not document or document.get("kind") != "CustomResourceDefinition":
                continue
            spec = document["spec"]
            crd = _Crd(
                spec["group"],
                spec["names"]["kind"],
                spec["scope"],
                {v["name"]: v for v in spec["versions"]},
                path,
            )
            index[(crd.group, crd.kind)] = crd
    return index


def _validate_custom_resource(
    crd: _Crd, version: str, manifest: Mapping[str, Any], minor: str, report: Report
) -> None:
    served = [name for name, v in crd.versions.items() if v.get("served")]
    if version not in served:
        report.error(
            "$.apiVersion",
            f"{crd.group}/{version} is not served by the {crd.kind} CRD ({crd.source.name}); "
            f"served: {', '.join(f'{crd.group}/{v}' for v in served)}",
        )
        return
    definition = crd.versions[version]
    if definition.get("deprecated"):
        warning = definition.get("deprecationWarning") or f"{crd.group}/{version} is deprecated"
        report.warnings.append(f"{report.object}: {warning}")
    schema = _strict_crd_schema(crd.group, crd.kind, version, str(crd.source))
    instance = copy.deepcopy(dict(manifest))
    _apply_defaults(instance, schema)
    _collect_schema_errors(
        _crd_validator(crd.group, crd.kind, version, str(crd.source), minor), instance, report
    )
    _check_list_types(instance, schema, report)
    _check_metadata(instance, _is_dns1123_subdomain, namespaced=crd.scope == "Namespaced", report=report)
    _evaluate_crd_rules(instance, schema, report)


@functools.cache
def _strict_crd_schema(group: str, kind: str, version: str, source: str) -> Schema:
    crd = _crd_index(str(Path(source).parent))[(group, kind)]
    schema: Schema = copy.deepcopy(crd.versions[version]["schema"]["openAPIV3Schema"])
    _make_strict(schema)
    schema.setdefault("properties", {})["metadata"] = {"$ref": _OBJECT_META_REF}
    return schema


@functools.cache
def _crd_validator(
    group: str, kind: str, version: str, source: str, minor: str
) -> jsonschema.Draft202012Validator:
    schema = _strict_crd_schema(group, kind, version, source)
    return jsonschema.Draft202012Validator(schema, registry=_definitions_registry(minor))


def _make_strict(schema: Schema) -> None:
    """Rewrite an OpenAPI v3 structural schema (in place) into a JSON schema that refuses what the API
    server prunes, i.e. what a strict field validation rejects as unknown."""
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^(?i)"):
        # RE2 (the API server's) takes inline flags anywhere; Python's re only at the start.
        schema["pattern"] = "(?i)^" + pattern[len("^(?i)") :]
    if schema.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and "type" in schema:
        schema["type"] = [schema["type"], "null"]
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    if schema.get("x-kubernetes-embedded-resource"):
        properties = schema.setdefault("properties", {})
        properties.setdefault("apiVersion", {"type": "string"})
        properties.setdefault("kind", {"type": "string"})
        properties["metadata"] = {"$ref": _OBJECT_META_REF}
        schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind"})
    is_object = schema.get("type") == "object" or "properties" in schema
    if (
        is_object
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    for child in _child_schemas(schema):
        _make_strict(child)


def _child_schemas(schema: Schema) -> Iterator[Schema]:
    yield from schema.get("properties", {}).values()
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            yield schema[key]
    for key in ("allOf", "anyOf", "oneOf"):
        yield from schema.get(key, [])


def _nodes(value: Any, schema: Schema, path: str = "$") -> Iterator[tuple[Any, Schema, str]]:
    """Each value of an instance with the schema that governs it, parents first; a consumer may add keys
    to a yielded mapping before its children are visited."""
    yield value, schema, path
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in list(value):
            child = properties.get(key, extra if key not in properties else None)
            if isinstance(child, dict):
                yield from _nodes(value[key], child, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _nodes(item, schema["items"], f"{path}[{index}]")


def _apply_defaults(instance: dict[str, Any], schema: Schema) -> None:
    """The API server's structural defaulting (apiextensions-apiserver pkg/apiserver/schema/defaulting):
    a missing property with a `default` gets it, then defaulting goes on inside."""
    for value, node, _ in _nodes(instance, schema):
        if isinstance(value, dict):
            for key, child in node.get("properties", {}).items():
                if key not in value and "default" in child:
                    value[key] = copy.deepcopy(child["default"])


def _check_list_types(instance: dict[str, Any], schema: Schema, report: Report) -> None:
    """x-kubernetes-list-type set/map: the API server refuses duplicate items / duplicate keys."""
    for value, node, path in _nodes(instance, schema):
        list_type = node.get("x-kubernetes-list-type")
        if not isinstance(value, list) or list_type not in ("set", "map"):
            continue
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen: set[str] = set()
        for index, item in enumerate(value):
            identity = item if list_type == "set" else {k: item.get(k) for k in keys}
            canonical = json.dumps(identity, sort_keys=True)
            if canonical in seen:
                report.error(f"{path}[{index}]", f"Duplicate value: {canonical}")
            seen.add(canonical)


# ------------------------------------------------------------------------------------------ metadata

# k8s.io/apimachinery pkg/util/validation/validation.go (IsDNS1123Label, IsDNS1123Subdomain,
# IsDNS1035Label, IsQualifiedName, IsValidLabelValue) and pkg/api/validation/objectmeta.go
# (TotalAnnotationSizeLimitB).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_ANNOTATIONS_LIMIT_BYTES = 256 * 1024


def _is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def _is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def _is_dns1035_label(value: str) -> bool:
    return len(value) <= 63 and _DNS1035_LABEL.fullmatch(value) is not None


def _is_path_segment(value: str) -> bool:
    return value not in (".", "..") and "/" not in value and "%" not in value


def _is_qualified_name(value: str) -> bool:
    prefix, _, name = value.rpartition("/")
    if "/" in prefix or (value.count("/") == 1 and not _is_dns1123_subdomain(prefix)):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def _is_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _QUALIFIED_NAME.fullmatch(value) is not None)


# Name rules of built-in kinds (kubernetes pkg/apis/core/validation: ValidateNamespaceName is a DNS-1123
# label, ValidateServiceName a DNS-1035 label; pkg/apis/rbac/validation: ValidateRBACName is a path
# segment name); the other built-in kinds and every custom resource use DNS-1123 subdomains
# (apiextensions-apiserver pkg/registry/customresource/strategy.go).
_NAME_RULES = {
    "Namespace": _is_dns1123_label,
    "Service": _is_dns1035_label,
    "Role": _is_path_segment,
    "ClusterRole": _is_path_segment,
    "RoleBinding": _is_path_segment,
    "ClusterRoleBinding": _is_path_segment,
}
_NAME_RULE_TEXT = {
    _is_dns1123_label: "a DNS-1123 label (lower case alphanumerics and '-', at most 63 characters)",
    _is_dns1123_subdomain: "a DNS-1123 subdomain (lower case alphanumerics, '-' and '.', at most 253)",
    _is_dns1035_label: "a DNS-1035 label (a letter, then lower case alphanumerics and '-', at most 63)",
    _is_path_segment: "a path segment name (not '.' or '..', no '/' or '%')",
}


def _builtin_name_rule(kind: str) -> Any:
    return _NAME_RULES.get(kind, _is_dns1123_subdomain)


def _check_metadata(
    manifest: Mapping[str, Any], name_rule: Any, *, namespaced: bool | None, report: Report
) -> None:
    """ObjectMeta as the API server validates it in Go; `namespaced` None when the scope is unknown."""
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict):
        report.error("$.metadata", "metadata is required")
        return
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        report.error("$.metadata.name", "metadata.name is required (applied objects are named)")
    elif not name_rule(name):
        report.error("$.metadata.name", f"{name!r} must be {_NAME_RULE_TEXT[name_rule]}")
    namespace = metadata.get("namespace")
    if namespace is not None:
        if namespaced is False:
            report.error("$.metadata.namespace", "not allowed on a cluster-scoped kind")
        elif not isinstance(namespace, str) or not _is_dns1123_label(namespace):
            report.error(
                "$.metadata.namespace", f"{namespace!r} must be {_NAME_RULE_TEXT[_is_dns1123_label]}"
            )
    for key, value in (metadata.get("labels") or {}).items():
        if not _is_qualified_name(key):
            report.error(f"$.metadata.labels.{key}", "label key is not a qualified name ([prefix/]name)")
        if not isinstance(value, str) or not _is_label_value(value):
            report.error(f"$.metadata.labels.{key}", f"label value {value!r} is not a valid label value")
    annotations = metadata.get("annotations") or {}
    for key in annotations:
        if not _is_qualified_name(key.lower()):
            report.error(f"$.metadata.annotations.{key}", "annotation key is not a qualified name")
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > _ANNOTATIONS_LIMIT_BYTES:
        report.error("$.metadata.annotations", f"annotations total {size} bytes, more than 256 KiB")


# ----------------------------------------------------------------------------------------------- CEL

_TRANSITION_REASON = "transition rule (oldSelf)"
_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter", "dyn"})
# celpy's own "min" and "reduce" are not the Kubernetes list functions of the same names.
_CELPY_FUNCTIONS = frozenset(base_functions) - {"min", "reduce"}
_RUNTIME_ERRORS = (KeyError, IndexError, ZeroDivisionError)
# CEL reserved words a property name is escaped from (https://kubernetes.io/docs/reference/using-api/cel/
# #escaping, k8s.io/apiserver pkg/cel/escaping.go).
_CEL_RESERVED = frozenset(
    {
        *("true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function"),
        *("if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"),
    }
)
_ESCAPES = {"__": "__underscores__", ".": "__dot__", "-": "__dash__", "/": "__slash__"}


def _find(text: str, pattern: str) -> cel.StringType:
    """Kubernetes regex library `<string>.find(<regex>)`: the first match, or '' (RE2, as in Go)."""
    match = re2.search(pattern, text)
    return cel.StringType(match.group(0) if match else "")


def _split(text: str, separator: str, limit: int = -1) -> cel.ListType:
    """cel-go ext strings `split(separator[, limit])`: Go's strings.SplitN."""
    if limit == 0:
        return cel.ListType([])
    if separator != "":
        parts = text.split(separator, -1 if limit < 0 else limit - 1)
    elif limit < 0 or len(text) <= limit:
        parts = list(text)
    else:
        parts = [*text[: limit - 1], text[limit - 1 :]]
    return cel.ListType([cel.StringType(p) for p in parts])


_KUBERNETES_FUNCTIONS: dict[str, Any] = {"find": _find, "split": _split}
_SUPPORTED_FUNCTIONS = _MACROS | _CELPY_FUNCTIONS | frozenset(_KUBERNETES_FUNCTIONS)

_ENVIRONMENT = celpy.Environment()


def compile_cel(expression: str) -> str | None:
    """None when celpy parses `expression`, else the parse error."""
    try:
        _ENVIRONMENT.compile(expression)
    except CELParseError as error:
        return str(error)
    return None


@functools.cache
def _program(expression: str) -> celpy.Runner | str:
    """A runnable program, or why celpy cannot run `expression`."""
    try:
        tree = _ENVIRONMENT.compile(expression)
    except CELParseError as error:
        return f"celpy cannot parse it: {str(error).splitlines()[0]}"
    unsupported = sorted(_called_functions(tree) - _SUPPORTED_FUNCTIONS)
    if unsupported:
        return f"calls {', '.join(unsupported)}, which celpy lacks (Kubernetes CEL libraries)"
    return _ENVIRONMENT.program(tree, functions=_KUBERNETES_FUNCTIONS)


def _called_functions(tree: Tree[Any]) -> set[str]:
    names: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data in ("member_dot_arg", "ident_arg", "dot_ident_arg"):
            names.update(str(c) for c in node.children if isinstance(c, Token) and c.type == "IDENT")
    return names


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    error: str | None = None  # a CEL runtime error: the API server refuses the request
    unsupported: str | None = None  # celpy could not decide


def _run(expression: str, activation: dict[str, Any]) -> _Outcome:
    program = _program(expression)
    if isinstance(program, str):
        return _Outcome(unsupported=program)
    value: Any
    try:
        value = program.evaluate(activation)
    except CELEvalError as error:
        value = error
    except Exception as error:  # celpy itself failed: not a verdict on the object
        return _Outcome(unsupported=f"celpy raised {type(error).__name__}: {error}")
    if isinstance(value, CELEvalError):
        cause = value.args[1] if len(value.args) > 1 else None
        if isinstance(cause, type) and issubclass(cause, _RUNTIME_ERRORS):
            return _Outcome(error=f"evaluation error: {value.args[0]}")
        return _Outcome(unsupported=f"celpy evaluation error: {value.args[0]}")
    return _Outcome(value=value)


def _is_true(value: Any) -> bool:
    return isinstance(value, cel.BoolType) and bool(value)


def _escape(name: str) -> str | None:
    """A property name as CEL sees it, None when CEL cannot reach it."""
    if name in _CEL_RESERVED:
        return f"__{name}__"
    if not re.fullmatch(r"[a-zA-Z_.\-/][a-zA-Z0-9_.\-/]*", name):
        return None
    return re.sub(r"__|[.\-/]", lambda m: _ESCAPES[m.group(0)], name)


def _to_cel(value: Any, schema: Schema) -> Any:
    """`value` typed as the Kubernetes CEL integration types it from its schema."""
    if schema.get("$ref") == _OBJECT_META_REF and isinstance(value, dict):
        # Only metadata.name and metadata.generateName are visible to CRD rules.
        return cel.MapType(
            {cel.StringType(k): cel.StringType(value[k]) for k in ("name", "generateName") if k in value}
        )
    if isinstance(value, dict):
        properties = schema.get("properties")
        if properties is not None:
            visible = ((_escape(k), v, properties[k]) for k, v in value.items() if k in properties)
            return cel.MapType({cel.StringType(k): _to_cel(v, s) for k, v, s in visible if k is not None})
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return cel.MapType({cel.StringType(k): _to_cel(v, extra) for k, v in value.items()})
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return cel.ListType([_to_cel(item, schema["items"]) for item in value])
    if isinstance(value, str):
        return _typed_string(value, schema.get("format"))
    if isinstance(value, int) and not isinstance(value, bool) and schema.get("type") == "number":
        return cel.DoubleType(value)
    return json_to_cel(value)


def _typed_string(value: str, string_format: str | None) -> Any:
    """A string as CEL sees it: date-time and byte formats are typed; a malformed one stays a string (the
    format is not checked here)."""
    try:
        if string_format in ("date-time", "datetime"):
            return cel.TimestampType(value)
        if string_format == "byte":
            return cel.BytesType(base64.b64decode(value, validate=True))
    except ValueError:
        pass
    return cel.StringType(value)


def _evaluate_crd_rules(instance: dict[str, Any], schema: Schema, report: Report) -> None:
    counts = report.cel
    for value, node, path in _nodes(instance, schema):
        for rule in node.get("x-kubernetes-validations", []):
            expression = rule["rule"]
            if re.search(r"\boldSelf\b", expression):
                reason = (
                    f"{_TRANSITION_REASON}: the API server evaluates it on update only"
                    if not rule.get("optionalOldSelf")
                    else "optionalOldSelf: on create oldSelf is optional.none(); celpy has no optional types"
                )
                counts.not_evaluated.append(NotEvaluated(path, expression, reason))
                continue
            activation = {"self": _to_cel(value, node)}
            outcome = _run(expression, activation)
            if outcome.unsupported is not None:
                counts.not_evaluated.append(NotEvaluated(path, expression, outcome.unsupported))
                continue
            counts.evaluated += 1
            if outcome.error is None and _is_true(outcome.value):
                counts.passed += 1
                continue
            counts.failed += 1
            message = outcome.error or _rule_message(rule, activation, f"failed rule: {expression}")
            field_path = rule.get("fieldPath", "")
            report.error(f"{path}{field_path}", f"{message} (x-kubernetes-validations rule: {expression})")


def _rule_message(rule: Mapping[str, Any], activation: dict[str, Any], default: str) -> str:
    if "messageExpression" in rule:
        outcome = _run(rule["messageExpression"], activation)
        if isinstance(outcome.value, str) and outcome.value:
            return str(outcome.value)
    return str(rule.get("message") or default)


# ----------------------------------------------------------------------- ValidatingAdmissionPolicy


@dataclass
class AdmissionResult:
    matched: bool
    failures: list[str] = field(default_factory=list)  # messages of the validations that refuse
    warnings: list[str] = field(default_factory=list)  # validations a binding only warns about
    not_evaluated: list[NotEvaluated] = field(default_factory=list)

    @property
    def admitted(self) -> bool | None:
        """True or False as the API server decides; None when celpy could not evaluate what decides."""
        if self.failures:
            return False
        return None if self.not_evaluated else True


# Variables of ValidatingAdmissionPolicy CEL that cannot be known offline.
_UNKNOWABLE = (
    (re.compile(r"\bauthorizer\b"), "uses the authorizer, which needs the API server"),
    (
        re.compile(r"\brequest\s*\.\s*userInfo\b"),
        "uses request.userInfo: the requesting user is unknown offline",
    ),
)


def guess_resource(kind: str) -> str:
    """The plural resource of a kind, as k8s.io/apimachinery meta.UnsafeGuessKindToResource guesses it."""
    singular = kind.lower()
    if singular.endswith("s"):
        return f"{singular}es"
    if singular.endswith("y"):
        return f"{singular[:-1]}ies"
    return f"{singular}s"


def evaluate_admission(
    policy: Mapping[str, Any],
    request_object: Mapping[str, Any],
    namespace_labels: Mapping[str, str] | None = None,
    *,
    binding: Mapping[str, Any] | None = None,
    operation: str = "CREATE",
    resource: str | None = None,
) -> AdmissionResult:
    """Run a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) on a request for `request_object`,
    `params` absent: its match constraints, matchConditions, variables and validations, then the binding's
    matchResources and validationActions when a binding is given (without one every failure denies).
    `namespace_labels` are the labels of the object's namespace (kubernetes.io/metadata.name is added)."""
    if policy.get("kind") != "ValidatingAdmissionPolicy":
        raise ValueError(f"{_describe(policy)} is not a ValidatingAdmissionPolicy")
    spec = policy["spec"]
    if spec.get("paramKind"):
        raise ValueError(
            f"{_describe(policy)} takes params ({spec['paramKind']}); evaluate_admission binds none"
        )
    request = _AdmissionRequest(request_object, namespace_labels, operation, resource)
    constraints = [spec.get("matchConstraints")]
    if binding is not None:
        constraints.append(binding["spec"].get("matchResources"))
    if not all(_matches_resources(c, request) for c in constraints if c is not None):
        return AdmissionResult(matched=False)
    activation = request.activation()
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    result = AdmissionResult(matched=True)

    for condition in spec.get("matchConditions", []):
        outcome = _run_admission(condition["expression"], activation, f"matchConditions[{condition['name']}]")
        if isinstance(outcome, NotEvaluated):
            result.not_evaluated.append(outcome)
            return result
        if outcome.error is not None:
            if fail_closed:
                result.failures.append(f"matchCondition {condition['name']}: {outcome.error}")
            return result
        if not _is_true(outcome.value):
            return AdmissionResult(matched=False)

    unknown_variables = _bind_variables(spec.get("variables", []), activation, result)
    actions = set(binding["spec"].get("validationActions", ["Deny"])) if binding is not None else {"Deny"}
    for index, validation in enumerate(spec.get("validations", [])):
        expression = validation["expression"]
        path = f"validations[{index}]"
        blocked = [
            name for name in unknown_variables if re.search(rf"\bvariables\s*\.\s*{name}\b", expression)
        ]
        if blocked:
            result.not_evaluated.append(
                NotEvaluated(path, expression, f"uses unevaluated variables {blocked}")
            )
            continue
        outcome = _run_admission(expression, activation, path)
        if isinstance(outcome, NotEvaluated):
            result.not_evaluated.append(outcome)
            continue
        if outcome.error is not None:
            message = outcome.error if fail_closed else None
        elif _is_true(outcome.value):
            message = None
        else:
            message = _rule_message(validation, activation, f"failed expression: {expression}")
        if message is None:
            continue
        if "Deny" in actions:
            result.failures.append(message)
        if "Warn" in actions:
            result.warnings.append(message)
    return result


def _policy_expressions(spec: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    for key, fields in (
        ("matchConditions", ("expression",)),
        ("variables", ("expression",)),
        ("validations", ("expression", "messageExpression")),
        ("auditAnnotations", ("valueExpression",)),
    ):
        for index, entry in enumerate(spec.get(key) or []):
            for name in fields:
                if name in entry:
                    yield f"$.spec.{key}[{index}].{name}", entry[name]


def _check_policy_expressions(policy: Mapping[str, Any], report: Report) -> None:
    """The API server compiles a policy's CEL on create; what celpy cannot parse stays undecided."""
    for path, expression in _policy_expressions(policy.get("spec") or {}):
        problem = compile_cel(expression)
        if problem is not None:
            reason = f"celpy cannot parse it: {problem.splitlines()[0]}"
            report.cel.not_evaluated.append(NotEvaluated(path, expression, reason))


def _run_admission(expression: str, activation: dict[str, Any], path: str) -> _Outcome | NotEvaluated:
    for pattern, reason in _UNKNOWABLE:
        if pattern.search(expression):
            return NotEvaluated(path, expression, reason)
    outcome = _run(expression, activation)
    if outcome.unsupported is not None:
        return NotEvaluated(path, expression, outcome.unsupported)
    return outcome


def _bind_variables(
    variables: list[Mapping[str, Any]], activation: dict[str, Any], result: AdmissionResult
) -> list[str]:
    """Evaluate the policy's variables in order into `variables`; the names that could not be."""
    bound: dict[str, Any] = {}
    activation["variables"] = cel.MapType(bound)
    unknown: list[str] = []
    for variable in variables:
        name, expression = variable["name"], variable["expression"]
        outcome = _run_admission(expression, activation, f"variables[{name}]")
        if isinstance(outcome, NotEvaluated):
            result.not_evaluated.append(outcome)
            unknown.append(name)
        elif outcome.error is None:
            bound[name] = outcome.value
            activation["variables"] = cel.MapType({cel.StringType(k): v for k, v in bound.items()})
    return unknown


@dataclass(frozen=True)
class _AdmissionRequest:
    object: Mapping[str, Any]
    namespace_labels: Mapping[str, str] | None
    operation: str
    resource_name: str | None

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = str(self.object["apiVersion"]).rpartition("/")
        return group, version

    @property
    def resource(self) -> str:
        return self.resource_name or guess_resource(str(self.object["kind"]))

    @property
    def namespace(self) -> str | None:
        namespace = self.object.get("metadata", {}).get("namespace")
        return str(namespace) if namespace else None

    def namespace_object_labels(self) -> dict[str, str]:
        if self.object.get("kind") == "Namespace" and self.group_version == ("", "v1"):
            return dict(self.object.get("metadata", {}).get("labels") or {})
        if self.namespace is None:
            return {}
        if self.namespace_labels is None:
            raise ValueError(
                f"{_describe(self.object)}: pass namespace_labels for namespace {self.namespace}"
            )
        return {**self.namespace_labels, NAMESPACE_NAME_LABEL: self.namespace}

    def activation(self) -> dict[str, Any]:
        group, version = self.group_version
        metadata = self.object.get("metadata", {})
        request = {
            "operation": self.operation,
            "name": metadata.get("name", ""),
            "namespace": self.namespace or "",
            "kind": {"group": group, "version": version, "kind": self.object["kind"]},
            "resource": {"group": group, "version": version, "resource": self.resource},
            "dryRun": False,
        }
        namespace_object = None
        if self.namespace is not None:
            namespace_object = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": self.namespace, "labels": self.namespace_object_labels()},
            }
        return {
            "object": json_to_cel(dict(self.object)),
            "oldObject": None,
            "params": None,
            "request": json_to_cel(request),
            "namespaceObject": json_to_cel(namespace_object),
        }


def _matches_resources(match: Mapping[str, Any], request: _AdmissionRequest) -> bool:
    """MatchResources (admissionregistration.k8s.io/v1): rules, exclusions and the two selectors."""
    if not any(_matches_rule(rule, request) for rule in match.get("resourceRules", [])):
        return False
    if any(_matches_rule(rule, request) for rule in match.get("excludeResourceRules", [])):
        return False
    labels = request.object.get("metadata", {}).get("labels") or {}
    if not _matches_selector(match.get("objectSelector"), labels):
        return False
    namespaced_or_namespace = request.namespace is not None or request.object.get("kind") == "Namespace"
    return not namespaced_or_namespace or _matches_selector(
        match.get("namespaceSelector"), request.namespace_object_labels()
    )


def _matches_rule(rule: Mapping[str, Any], request: _AdmissionRequest) -> bool:
    group, version = request.group_version
    scope = rule.get("scope", "*")
    in_scope = scope == "*" or (scope == "Namespaced") == (request.namespace is not None)
    names = rule.get("resourceNames") or []
    return (
        in_scope
        and _listed(group, rule.get("apiGroups", []))
        and _listed(version, rule.get("apiVersions", []))
        and _listed(request.operation, rule.get("operations", []))
        and (set(rule.get("resources", [])) & {request.resource, "*", "*/*"} != set())
        and (not names or request.object.get("metadata", {}).get("name") in names)
    )


def _listed(value: str, allowed: list[str]) -> bool:
    return "*" in allowed or value in allowed


def _matches_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; absent or empty selects everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values", [])
        present = key in labels
        satisfied = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not satisfied:
            return False
    return True


# ------------------------------------------------------------------------------------------- helpers


def _describe(manifest: Mapping[str, Any]) -> str:
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    name = metadata.get("name", "<unnamed>")
    namespace = metadata.get("namespace")
    return f"{manifest.get('kind', '<no kind>')} {f'{namespace}/' if namespace else ''}{name}"
