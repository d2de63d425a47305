"""No import cycles in `pyruntime/`, between its top-level nodes or inside a subpackage.

The graph code lives in `tools/import_graph.py` (run it for the whole picture); this test runs
the same code on the source tree (nothing is imported) and on small made-up packages that pin
what the scan counts as an import.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_tool():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools/import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


graph = _load_tool()


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
