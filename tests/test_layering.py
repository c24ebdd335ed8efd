"""handrail's modules import one way: down the floors of docs/design.md, never in a circle.

The floors are written once, in docs/design.md under `## Floors (imports only go down)`: one
numbered item a floor, listing module patterns in backticks (`handrail.engine`, or
`handrail.tools.*` for a package and everything in it; the most specific pattern wins). This
test reads them from there, so the page and the check cannot drift, and parses (ast) every
module of src/handrail for EVERY handrail import: at module level, inside functions, under
`TYPE_CHECKING`, relative and absolute. It fails on:

- an import that goes up a floor (`handrail.capture (floor 4) imports handrail.engine
  (floor 5) at capture.py:241`), including the implicit one of a module placed lower than
  the package it sits in (Python runs the package's `__init__` first);
- a cycle of imports (within a floor, since an upward edge is reported anyway);
- a module that no floor names (a new module must be placed), or a pattern that names none.

A name imported from a package's `__init__` that only re-exports it (`from handrail.tools
import Tool`) counts as an import of the module that defines it, found through the package's
own imports, so a facade does not make cycles of its own.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src"
DESIGN = ROOT / "docs" / "design.md"
HEADING = "## Floors (imports only go down)"


@dataclass(frozen=True)
class Import:
    """One handrail-internal import: `source` imports `target` at `where` (file:line)."""

    source: str
    target: str
    where: str


@dataclass(frozen=True)
class Module:
    name: str
    file: str
    """Its path inside the package's directory (`tools/_dispatch.py`)."""
    tree: ast.Module
    is_package: bool


# -- reading the floors --------------------------------------------------------------------


def read_floors(markdown: str, package: str = "handrail") -> dict[int, list[str]]:
    """Floor number -> its module patterns (those of `package`), from the list under HEADING.

    Other backticked words of the list (`Agent.run`) are prose, not patterns.
    """
    heading = HEADING
    start = markdown.find(heading + "\n")
    if start < 0:
        raise AssertionError(f"docs/design.md has no {heading!r} section.")
    section = markdown[start + len(heading) :]
    end = re.search(r"^## ", section, re.M)
    section = section[: end.start()] if end else section
    floors: dict[int, list[str]] = {}
    floor: int | None = None
    for line in section.splitlines():
        item = re.match(r"(\d+)\. ", line)
        if item:
            floor = int(item.group(1))
            floors[floor] = []
        elif not line.startswith(" "):
            floor = None  # the list item ended
        if floor is not None:
            floors[floor] += re.findall(rf"`({package}(?:\.[\w*]+)*)`", line)
    if not floors:
        raise AssertionError(f"The {heading!r} section of docs/design.md lists no floors.")
    return floors


def _matches(pattern: str, module: str) -> int | None:
    """How specific `pattern` is for `module` (higher wins), or None when it does not match."""
    if pattern == module:
        return 10_000
    if pattern.endswith(".*"):
        package = pattern[:-2]
        if module == package or module.startswith(package + "."):
            return package.count(".") + 1
    return None


def assign(floors: dict[int, list[str]], modules: list[str]) -> tuple[dict[str, int], list[str]]:
    """Each module's floor (its most specific pattern's), and what is wrong with the patterns."""
    problems: list[str] = []
    placed: dict[str, int] = {}
    used: set[str] = set()
    for module in modules:
        best: dict[int, set[int]] = {}
        for floor, patterns in floors.items():
            for pattern in patterns:
                score = _matches(pattern, module)
                if score is not None:
                    best.setdefault(score, set()).add(floor)
                    used.add(pattern)
        if not best:
            problems.append(
                f"{module} has no floor: add it (or a pattern that covers it) to the "
                f"{HEADING!r} section of docs/design.md."
            )
            continue
        top = best[max(best)]
        if len(top) > 1:
            problems.append(f"{module} is on floors {sorted(top)} at once in docs/design.md.")
        placed[module] = min(top)
    for floor, patterns in floors.items():
        for pattern in patterns:
            if pattern not in used:
                problems.append(f"Floor {floor} names {pattern}, which matches no module.")
    return placed, problems


# -- reading the imports -------------------------------------------------------------------


def load_modules(source: Path, package: str) -> dict[str, Module]:
    """Every module of `package` under `source`, by dotted name."""
    modules: dict[str, Module] = {}
    for path in sorted((source / package).rglob("*.py")):
        parts = list(path.relative_to(source).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        tree = ast.parse(path.read_text(), str(path))
        file = path.relative_to(source / package).as_posix()
        modules[".".join(parts)] = Module(".".join(parts), file, tree, is_package)
    return modules


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _defining(modules: dict[str, Module], module: str, name: str, seen: frozenset[str]) -> str:
    """The module a name imported from `module` comes from (through package facades)."""
    if f"{module}.{name}" in modules:
        return f"{module}.{name}"
    found = modules.get(module)
    if found is None or not found.is_package or module in seen:
        return module
    for node in ast.walk(found.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    origin = _absolute(found, node)
                    if origin in modules or f"{origin}.{alias.name}" in modules:
                        return _defining(modules, origin, alias.name, seen | {module})
    return module


def collect_imports(modules: dict[str, Module], package: str) -> list[Import]:
    """Every import of a `package` module by a `package` module, wherever it is written."""
    found: list[Import] = []
    for module in modules.values():

        def add(target: str, line: int, module: Module = module) -> None:
            if target != module.name:
                found.append(Import(module.name, target, f"{module.file}:{line}"))

        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                origin = _absolute(module, node)
                if origin == package or origin.startswith(package + "."):
                    for alias in node.names:
                        add(_defining(modules, origin, alias.name, frozenset()), node.lineno)
    return found


# -- the check -----------------------------------------------------------------------------


def cycles(imports: list[Import]) -> list[tuple[list[str], list[str]]]:
    """Each group of modules that import each other round: one cycle in it, and its members.

    The cycle is a path that returns to its start (the group's first module); the group is
    every module reachable from it and back (Tarjan's strongly connected components).
    """
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [(_path(graph, group), group) for group in groups]


def _path(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A cycle through `group`'s first module, by breadth-first search inside the group."""
    start, members = group[0], set(group)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in came:
                    came[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def check(source: Path, package: str, floors: dict[int, list[str]]) -> list[str]:
    """Every layering problem of `package` (a directory under `source`), readably."""
    modules = load_modules(source, package)
    placed, problems = assign(floors, sorted(modules))
    imports = collect_imports(modules, package)
    for imp in sorted(imports, key=lambda i: (i.source, i.where)):
        low, high = placed.get(imp.source), placed.get(imp.target)
        if low is not None and high is not None and high > low:
            problems.append(
                f"{imp.source} (floor {low}) imports {imp.target} (floor {high}) at {imp.where}"
            )
    for name in sorted(modules):
        parts = name.split(".")
        for depth in range(2, len(parts)):  # the root package is everyone's: not counted
            parent = ".".join(parts[:depth])
            low, high = placed.get(name), placed.get(parent)
            if low is not None and high is not None and high > low:
                problems.append(
                    f"{name} (floor {low}) sits in package {parent} (floor {high}), whose "
                    f"__init__ Python imports first: move it out, or raise its floor"
                )
    for cycle, group in sorted(cycles(imports)):
        also = sorted(set(group) - set(cycle))
        more = f" (and round through {', '.join(also)})" if also else ""
        problems.append("import cycle: " + " -> ".join(cycle) + more)
    return problems


# -- the tests -----------------------------------------------------------------------------


def test_handrail_imports_only_go_down_the_floors() -> None:
    floors = read_floors(DESIGN.read_text())
    problems = check(SOURCE, "handrail", floors)
    assert not problems, "\n".join(
        [f"{len(problems)} layering problem(s) (floors: docs/design.md):", *problems]
    )


def test_floors_are_numbered_one_up() -> None:
    floors = read_floors(DESIGN.read_text())
    assert sorted(floors) == list(range(1, len(floors) + 1))
    assert all(floors.values())


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


FLOORS_PAGE = """\
# Design

## Floors (imports only go down)

1. `pkg.low`, `pkg.sub.*` (a package and everything in it)
2. `pkg.mid`, `pkg.other`, `pkg.sub.high`
3. `pkg`, `pkg.top`, `pkg.gone`

## Next section

4. `pkg.not_a_floor`
"""


def test_the_page_is_read_as_floors() -> None:
    assert read_floors(FLOORS_PAGE, "pkg") == {
        1: ["pkg.low", "pkg.sub.*"],
        2: ["pkg.mid", "pkg.other", "pkg.sub.high"],
        3: ["pkg", "pkg.top", "pkg.gone"],
    }
    with pytest.raises(AssertionError, match="no '## Floors"):
        read_floors("# Design\n", "pkg")


def test_an_upward_import_a_cycle_and_an_unplaced_module_are_reported(tmp_path: Path) -> None:
    source = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from .top import Top\n",
            "pkg/low.py": (
                "from __future__ import annotations\n"
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from .mid import Mid\n"
                "def f():\n"
                "    from pkg.top import Top\n"
            ),
            "pkg/mid.py": "from . import other\nclass Mid: ...\n",
            "pkg/other.py": "from .mid import Mid\n",
            "pkg/top.py": "import json\nfrom pkg.low import f\nclass Top: ...\n",
            "pkg/sub/__init__.py": "from .leaf import Leaf\n",
            "pkg/sub/leaf.py": "class Leaf: ...\n",
            "pkg/sub/high.py": "from pkg.sub import Leaf\n",
            "pkg/stray.py": "from pkg import Top\n",
        },
    )
    problems = check(source, "pkg", read_floors(FLOORS_PAGE, "pkg"))
    assert problems == [
        "pkg.stray has no floor: add it (or a pattern that covers it) to the "
        "'## Floors (imports only go down)' section of docs/design.md.",
        "Floor 3 names pkg.gone, which matches no module.",
        "pkg.low (floor 1) imports pkg.mid (floor 2) at low.py:4",
        "pkg.low (floor 1) imports pkg.top (floor 3) at low.py:6",
        "import cycle: pkg.low -> pkg.top -> pkg.low",
        "import cycle: pkg.mid -> pkg.other -> pkg.mid",
    ]


def test_a_module_below_its_package_is_reported(tmp_path: Path) -> None:
    source = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/agent/__init__.py": "from .spec import Spec\n",
            "pkg/agent/spec.py": "class Spec: ...\n",
        },
    )
    floors = {1: ["pkg.agent.spec"], 2: ["pkg.agent"], 3: ["pkg"]}
    assert check(source, "pkg", floors) == [
        "pkg.agent.spec (floor 1) sits in package pkg.agent (floor 2), whose __init__ Python "
        "imports first: move it out, or raise its floor"
    ]


def test_a_facade_resolves_to_the_defining_module(tmp_path: Path) -> None:
    source = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/tools/__init__.py": (
                "from ._tool import Tool as Tool\n"
                "def __getattr__(name):\n"
                "    from .lazy import Lazy\n"
                "    return Lazy\n"
            ),
            "pkg/tools/_tool.py": "class Tool: ...\n",
            "pkg/tools/lazy.py": "from pkg.tools import Tool\nclass Lazy: ...\n",
            "pkg/user.py": "from .tools import Lazy, Tool, _tool\n",
        },
    )
    modules = load_modules(source, "pkg")
    edges = {(i.source, i.target) for i in collect_imports(modules, "pkg")}
    assert edges == {
        ("pkg.tools", "pkg.tools._tool"),
        ("pkg.tools", "pkg.tools.lazy"),
        ("pkg.tools.lazy", "pkg.tools._tool"),
        ("pkg.user", "pkg.tools.lazy"),
        ("pkg.user", "pkg.tools._tool"),
    }
