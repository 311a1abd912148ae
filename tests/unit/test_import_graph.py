"""The import graph of infra/ against docs/architecture.md: no module imports one that imports it back
(directly or through others), no package imports one its row of the architecture's table does not list, and
the packages marked "no" import neither Pulumi nor Ansible.

Every import statement that runs counts, deferred ones inside functions included: a deferred import is how a
cycle hides, not how it is removed. Imports under `if TYPE_CHECKING:` never run; they name types only."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(INFRA.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def infra_modules(root: Path = INFRA) -> dict[str, Path]:
    return {module_name(path): path for path in sorted(root.rglob("*.py"))}


def imported_names(module: str, path: Path) -> Iterable[str]:
    """The dotted names an import statement of the module names, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of infra/ it imports (`from pkg import mod` counts as importing mod)."""
    return {
        module: {name for name in imported_names(module, path) if name in modules and name != module}
        for module, path in modules.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def one_cycle(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path around the component from its first member back to it: the cycle to name."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """infra's top-level packages (infra.spec, infra.platform, ...) and the ones each imports."""
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        packages.setdefault(package(module), set()).update(
            package(name) for name in imported if package(name) != package(module)
        )
    return packages


def describe(graph: Mapping[str, set[str]]) -> str:
    return "; ".join(" -> ".join(one_cycle(graph, c)) for c in cycles(graph))


def test_no_module_of_infra_imports_one_that_imports_it_back() -> None:
    graph = import_graph(infra_modules())
    assert len(graph) > 100
    assert not cycles(graph), f"import cycles: {describe(graph)}"


@dataclass(frozen=True)
class PackageRule:
    may_import: frozenset[str]
    # The package's modules that may import Pulumi or Ansible: "*" for all of them.
    pulumi_or_ansible: frozenset[str]

    def allows_pulumi_or_ansible(self, module: str) -> bool:
        parts = module.split(".")
        return "*" in self.pulumi_or_ansible or (len(parts) > 2 and parts[2] in self.pulumi_or_ansible)


ROW = re.compile(r"^\|\s*`(infra[^`]*)`\s*\|")


def architecture_rules(text: str) -> dict[str, PackageRule]:
    """The table of docs/architecture.md: `| `infra.x` | job | may import | Pulumi/Ansible |`. "every package
    above" allows the packages of the rows above it; the last column is "no", "yes" (every module) or
    "yes (`a`, `b`)" (those modules only). A row that starts like a package's and does not parse is an
    error, not a row skipped."""
    rules: dict[str, PackageRule] = {}
    for line in text.splitlines():
        if not ROW.match(line.strip()):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        package = cells[0].strip("`")
        if len(cells) != 4 or not re.fullmatch(r"infra\.\w+", package):
            raise ValueError(f"docs/architecture.md: cannot read the row {line.strip()!r}")
        allowed = (
            set(rules)
            if cells[2] == "every package above"
            else {f"infra.{name.strip()}" for name in cells[2].split(",") if name.strip()}
        )
        column = cells[3]
        if column == "no":
            modules: frozenset[str] = frozenset()
        elif column == "yes":
            modules = frozenset({"*"})
        elif match := re.fullmatch(r"yes \((.+)\)", column):
            modules = frozenset(re.findall(r"`(\w+)`", match.group(1)))
        else:
            raise ValueError(f"docs/architecture.md: {package}: Pulumi/Ansible column {column!r}")
        rules[package] = PackageRule(frozenset(allowed), modules)
    return rules


def outside_imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_names("", path) if not name.startswith("infra")}


def test_infra_packages_import_only_what_the_architecture_allows() -> None:
    graph = import_graph(infra_modules())
    packages = package_graph(graph)
    rules = architecture_rules(ARCHITECTURE.read_text(encoding="utf-8"))
    assert set(packages) - {"infra"} == set(rules), "packages of infra/ and rows of docs/architecture.md"
    assert not packages["infra"], "infra/__init__.py runs before every module of infra/: it imports nothing"
    assert not cycles(packages), f"package cycles: {describe(packages)}"
    wrong = [
        f"{module} imports {name}"
        for module, imported in sorted(graph.items())
        if package(module) != "infra"
        for name in sorted(imported)
        if package(name) != package(module) and package(name) not in rules[package(module)].may_import
    ]
    assert not wrong, f"imports docs/architecture.md does not allow: {wrong}"


def test_the_core_imports_neither_pulumi_nor_ansible() -> None:
    rules = architecture_rules(ARCHITECTURE.read_text(encoding="utf-8"))
    assert sum(not rule.pulumi_or_ansible for rule in rules.values()) >= 8
    wrong = [
        f"{module} imports {sorted(found)}"
        for module, path in sorted(infra_modules().items())
        if module == "infra" or not rules[package(module)].allows_pulumi_or_ansible(module)
        for found in [
            {n for n in outside_imports(path) if n == "ansible" or n == "pulumi" or n.startswith("pulumi_")}
        ]
        if found
    ]
    assert not wrong, wrong


def test_a_handful_of_modules_at_the_top_of_infra() -> None:
    top = sorted(path.name for path in INFRA.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "program.py"], top


def test_infra_imports_its_modules_by_name_only() -> None:
    """importlib.import_module and __import__ hide an import from the graph above."""
    dynamic = [
        f"{module}:{node.lineno}"
        for module, path in sorted(infra_modules().items())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in {"__import__", "import_module"})
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        )
    ]
    assert not dynamic, f"dynamic imports: {dynamic}"


def test_the_table_is_read_and_an_import_it_lacks_is_caught() -> None:
    rules = architecture_rules(
        "| package | job | may import | Pulumi/Ansible |\n|---|---|---|---|\n"
        "| `infra.data` | facts | errors | no |\n| `infra.spec` | stack | errors, data | no |\n"
        "| `infra.plan` | plan | spec | yes (`record`, `check`) |\n"
        "| `infra.cli` | gpuplat | every package above | yes |\n"
    )
    assert rules["infra.spec"].may_import == {"infra.errors", "infra.data"}
    assert rules["infra.cli"].may_import == {"infra.data", "infra.spec", "infra.plan"}
    assert "infra.spec" not in rules["infra.data"].may_import
    assert rules["infra.plan"].allows_pulumi_or_ansible("infra.plan.record")
    assert not rules["infra.plan"].allows_pulumi_or_ansible("infra.plan.diff")
    assert rules["infra.cli"].allows_pulumi_or_ansible("infra.cli.app")
    assert not rules["infra.data"].allows_pulumi_or_ansible("infra.data.load")
    with pytest.raises(ValueError, match="cannot read the row"):
        architecture_rules("| `infra.training.job_env` | jobs | data | no |\n")
    with pytest.raises(ValueError, match="Pulumi/Ansible column"):
        architecture_rules("| `infra.data` | facts | errors | maybe |\n")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # a deferred import inside a function closes a cycle all the same
        ({"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import a\n"}, [["pkg.a", "pkg.b"]]),
        # relative imports, through a third module
        (
            {"a.py": "from .b import x\n", "b.py": "from . import c\n", "c.py": "from pkg.a import y\n"},
            [["pkg.a", "pkg.b", "pkg.c"]],
        ),
        ({"a.py": "import pkg.b\n", "b.py": "import os\n"}, []),
        # a type-only import runs never
        (
            {
                "a.py": "import pkg.b\n",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
            },
            [],
        ),
    ],
)
def test_the_checker_finds_cycles(tmp_path: Path, source: dict[str, str], expected: list[list[str]]) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in source.items():
        (root / name).write_text(text)
    modules = {
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
        for p in root.rglob("*.py")
    }
    graph = {m: {n for n in imported_names(m, p) if n in modules and n != m} for m, p in modules.items()}
    assert cycles(graph) == expected
    if expected:
        cycle = one_cycle(graph, expected[0])
        assert cycle[0] == cycle[-1] and len(cycle) == len(expected[0]) + 1
