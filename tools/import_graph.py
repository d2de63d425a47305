#!/usr/bin/env python3
"""The import graph of `pyruntime/`, and its cycles, from the source alone (nothing is imported).

Two graphs, read from every module with `ast`:

- between the top-level nodes: each subpackage (``kernels``, ``backends``, ...) and each top-level
  module (``attention``, ``tiling``, ...) of `pyruntime/` is one node;
- inside each subpackage: its modules (``kernels.step``, ``kernels.__init__``, ...).

An edge is a runtime import: ``import`` and ``from ... import`` anywhere in a module (function
bodies included), relative imports resolved, ``from pkg import submodule`` read as an import of
the submodule, and ``importlib.import_module("pyruntime...")`` with a literal name. Imports under
``if TYPE_CHECKING:`` are skipped (its ``else:`` branch is kept). Cycles are the strongly connected
components (Tarjan) with more than one member, or one member importing itself.

    python tools/import_graph.py [--edges] [--json]

prints every cycle with the import lines that make it (exit status 1 if there is any), and with
``--edges`` the whole top-level graph. `tests/test_layering.py` runs the same code and fails on any
cycle; `docs/design.md`, section 8, draws the layers it keeps.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "pyruntime"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


@dataclass(frozen=True)
class Import:
    """One runtime import: `source` (dotted module) imports `target` (dotted module), at `line`."""

    source: str
    target: str
    path: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name (``pyruntime.kernels.step``, ``pyruntime.kernels`` for its
    ``__init__``) -> file, for every ``.py`` under `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules (``pyruntime.x.y.attr`` ->
    ``pyruntime.x.y``), or None for a third-party name."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(tree: ast.AST, package: str, modules: dict[str, Path]):
    """(node, imported module or None) for every runtime import in `tree`, a module of
    `package`."""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, _resolve(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if _resolve(base, modules) is None:
                continue
            for alias in node.names:
                # `from pkg import submodule` imports the submodule; `from pkg import name`
                # runs pkg (its __init__)
                yield node, _resolve(f"{base}.{alias.name}", modules)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            yield node, _resolve(node.args[0].value, modules)


def module_imports(modules: dict[str, Path] | None = None, root: Path = ROOT) -> list[Import]:
    """Every runtime import of one of our modules by one of our modules (`modules` from
    `module_files(root)`)."""
    modules = module_files(root) if modules is None else modules
    found: list[Import] = []
    for module, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        rel = str(path.relative_to(root.parent))
        package = _package_of(module, path)
        for node, target in _targets(ast.parse(source, filename=str(path)), package, modules):
            if target is not None and target != module:
                found.append(Import(module, target, rel, node.lineno,
                                    lines[node.lineno - 1].strip()))
    # `from m import a, b` is one import of m; in file and line order
    return sorted(dict.fromkeys(found), key=lambda i: (i.path, i.line, i.target))


def top_node(module: str) -> str | None:
    """``pyruntime.kernels.step`` -> ``kernels``; ``pyruntime.attention`` -> ``attention``;
    None for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def top_level_edges(imports: list[Import]) -> dict[tuple[str, str], list[Import]]:
    """(node, node) -> the imports that make that edge, between top-level nodes."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports:
        a, b = top_node(imp.source), top_node(imp.target)
        if a and b and a != b:
            edges[a, b].append(imp)
    return dict(edges)


def subpackage_edges(imports: list[Import],
                     modules: dict[str, Path]) -> dict[str, dict[tuple[str, str], list[Import]]]:
    """subpackage -> (module, module) -> imports, between the modules of each subpackage
    (``kernels.__init__`` names the package's own module)."""

    def short(module: str) -> str:
        name = module.split(".", 1)[1]
        return f"{name}.__init__" if modules[module].name == "__init__.py" else name

    graphs: dict[str, dict[tuple[str, str], list[Import]]] = defaultdict(lambda: defaultdict(list))
    for imp in imports:
        a, b = top_node(imp.source), top_node(imp.target)
        if a and a == b and modules[f"{PACKAGE}.{a}"].name == "__init__.py":
            graphs[a][short(imp.source), short(imp.target)].append(imp)
    return {k: dict(v) for k, v in graphs.items()}


def strongly_connected(nodes, edges) -> list[list[str]]:
    """Tarjan's strongly connected components of the graph (`nodes`, `edges` a set of pairs)."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(edges):
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:
        # iterative, so a deep graph cannot hit the recursion limit
        work = [(v, iter(succ[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    components.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return components


@dataclass
class Cycle:
    """One strongly connected component with more than one member: its graph (``top level`` or a
    subpackage's name), members, and the imports between members."""

    graph: str
    members: list[str]
    imports: dict[tuple[str, str], list[Import]]

    def shortest_loop(self) -> list[str]:
        """One shortest import loop inside the component (breadth-first), first node repeated
        at the end: the quickest way to read why these modules belong together."""
        succ: dict[str, list[str]] = defaultdict(list)
        for a, b in sorted(self.imports):
            succ[a].append(b)
        best: list[str] = []
        for start in self.members:
            parent: dict[str, str | None] = {start: None}
            queue, loop = [start], None
            while queue and loop is None:
                v = queue.pop(0)
                for w in succ[v]:
                    if w == start:
                        loop = [v]
                        while parent[loop[-1]] is not None:
                            loop.append(parent[loop[-1]])
                        loop = [*reversed(loop), start]
                        break
                    if w not in parent:
                        parent[w] = v
                        queue.append(w)
            if loop and (not best or len(loop) < len(best)):
                best = loop
        return best

    def render(self) -> str:
        out = [f"cycle in {self.graph}: {' , '.join(self.members)}",
               f"  shortest loop: {' -> '.join(self.shortest_loop())}",
               "  imports between its members:"]
        for (a, b), imps in sorted(self.imports.items()):
            out.append(f"  {a} -> {b}")
            out.extend(f"      {imp.where()}" for imp in imps)
        return "\n".join(out)


def _cycles_of(graph: str, nodes, edges: dict[tuple[str, str], list[Import]]) -> list[Cycle]:
    cycles = []
    for component in strongly_connected(nodes, set(edges)):
        members = set(component)
        inner = {e: imps for e, imps in edges.items() if e[0] in members and e[1] in members}
        if len(component) > 1 or inner:
            cycles.append(Cycle(graph, component, inner))
    return cycles


def cycles(root: Path = ROOT) -> list[Cycle]:
    """Every import cycle: between top-level nodes, then inside each subpackage."""
    modules = module_files(root)
    imports = module_imports(modules, root)
    tops = {top_node(m) for m in modules} - {None}
    found = _cycles_of("top level", tops, top_level_edges(imports))
    for package, edges in sorted(subpackage_edges(imports, modules).items()):
        nodes = {n for e in edges for n in e}
        found += _cycles_of(f"pyruntime/{package}", nodes, edges)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="print the top-level graph too")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    modules = module_files()
    edges = top_level_edges(module_imports(modules))
    found = cycles()
    if args.json:
        print(json.dumps({
            "edges": sorted(f"{a} -> {b}" for a, b in edges),
            "cycles": [{"graph": c.graph, "members": c.members,
                        "imports": [i.where() for imps in c.imports.values() for i in imps]}
                       for c in found]}, indent=2))
        return 1 if found else 0
    if args.edges:
        succ: dict[str, list[str]] = defaultdict(list)
        for a, b in sorted(edges):
            succ[a].append(b)
        for node in sorted({top_node(m) for m in modules} - {None}):
            print(f"{node} -> {', '.join(succ[node]) or '(nothing)'}")
        print()
    for cycle in found:
        print(cycle.render())
    print(f"{len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
