"""No import cycles in `pyruntime/`, between its top-level nodes or inside a subpackage.

The graph code lives in `tools/import_graph.py` (run it for the whole picture); this test runs
the same code on the source tree (nothing is imported) and on small made-up packages that pin
what the scan counts as an import.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import import_graph as graph  # from tools/, on the path above


def test_pyruntime_has_no_import_cycle():
    found = graph.cycles()
    if found:
        pytest.fail(f"{len(found)} import cycle(s) in pyruntime/ (docs/design.md, section 8, "
                    "says which way each arrow may go):\n\n"
                    + "\n\n".join(c.render() for c in found), pytrace=False)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pyruntime"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_function_level_relative_and_submodule_imports_are_edges(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/base.py": "def f():\n    from ..high import top  # function level, relative\n",
        "high/__init__.py": "",
        "high/top.py": "from pyruntime.low import base  # a submodule by `from pkg import`\n",
    })
    (cycle,) = graph.cycles(root)
    assert cycle.graph == "top level" and cycle.members == ["high", "low"]
    lines = [i.where() for imps in cycle.imports.values() for i in imps]
    assert "pyruntime/low/base.py:2: from ..high import top  # function level, relative" in lines
    assert cycle.shortest_loop() in (["high", "low", "high"], ["low", "high", "low"])


def test_type_checking_imports_are_not_edges_but_its_else_branch_is(tmp_path):
    files = {
        "__init__.py": "",
        "a.py": "import pyruntime.b\n",
        "b.py": ("from typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from pyruntime import a\n"),
    }
    assert graph.cycles(_package(tmp_path, files)) == []
    files["b.py"] += "else:\n    import importlib\n    importlib.import_module('pyruntime.a')\n"
    (cycle,) = graph.cycles(_package(tmp_path, files))
    assert cycle.members == ["a", "b"]


def test_cycles_inside_a_subpackage_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "k/__init__.py": "",
        "k/one.py": "from . import two\n",
        "k/two.py": "def g():\n    from pyruntime.k.one import x\n",
        "k/three.py": "from . import one\n",
    })
    (cycle,) = graph.cycles(root)
    assert cycle.graph == "pyruntime/k" and cycle.members == ["k.one", "k.two"]


@pytest.mark.parametrize("name", ["x", "x.y"])
def test_third_party_names_are_not_nodes(tmp_path, name):
    root = _package(tmp_path, {"__init__.py": "", "a.py": f"import {name}\nimport torch\n"})
    assert graph.module_imports(root=root) == []


def _documented_layers() -> dict[str, tuple[int, list[str]]]:
    """docs/design.md section 8's table: piece -> (layer, the pieces it imports)."""
    text = (ROOT / "docs/design.md").read_text()
    marker = "<!-- layers: tests/test_layering.py reads this block -->"
    assert marker in text, f"docs/design.md lost its layer table ({marker})"
    block = text.split(marker, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    table: dict[str, tuple[int, list[str]]] = {}
    for line in block.splitlines():
        layer, rest = line.split(None, 1)
        node, _, imports = (part.strip() for part in rest.partition("->"))
        assert node not in table, f"docs/design.md lists {node} twice"
        table[node] = (int(layer), [] if imports == "(nothing)" else imports.split(", "))
    return table


def test_every_import_points_down_the_documented_layers():
    table = _documented_layers()
    modules = graph.module_files()
    assert set(table) == {graph.top_node(m) for m in modules} - {None}, (
        "docs/design.md section 8 must list every subpackage and top-level module once")
    upward = [f"{a} (layer {table[a][0]}) -> {b} (layer {table[b][0]}):\n"
              + "\n".join(f"    {i.where()}" for i in imps)
              for (a, b), imps in sorted(graph.top_level_edges(graph.module_imports()).items())
              if table[a][0] <= table[b][0]]
    if upward:
        pytest.fail("imports that do not point to a lower layer of docs/design.md section 8:\n"
                    + "\n".join(upward), pytrace=False)


def test_the_documented_arrows_are_the_code_s():
    edges = graph.top_level_edges(graph.module_imports())
    code = {node: sorted(b for a, b in edges if a == node) for node in _documented_layers()}
    documented = {node: imports for node, (_, imports) in _documented_layers().items()}
    differ = {n: (documented[n], code[n]) for n in code if documented[n] != code[n]}
    assert not differ, ("docs/design.md section 8 says (first) what the code does not "
                        "(second); `python tools/import_graph.py --edges` prints the code's "
                        f"arrows: {differ}")
