"""No two C translation units of aicpu_kernels/ call each other (issue 31).

Each aicpu_kernels/*.c is compiled to an object with the flags of the cffi build
(bindings/build_config.py) and read with `nm`: TU A depends on TU B when one of A's undefined
global symbols is defined by B. The test fails on any cycle of that graph, two TUs or more,
and names it. A cycle means a concept has no single home: the TUs can be neither understood
nor linked apart (the C tests link subsets of them).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "aicpu_kernels"
sys.path.insert(0, str(REPO / "bindings"))
sys.path.insert(0, str(REPO / "tools"))
import build_config
import import_graph  # the one cycle finder (tests/test_layering.py runs it on pyruntime/)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                                reason="needs gcc and nm")


def symbols(obj: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) global symbols of an object file."""
    out = subprocess.run(["nm", "-g", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] not in ("U", "w", "v"):
            defined.add(parts[2])
    return defined, undefined


def tu_graph(tmp_path: Path) -> dict[str, set[str]]:
    """TU name -> the TUs whose symbols it references."""
    flags, _ = build_config.compile_args({})
    table = {}
    for source in sorted(KERNELS.glob("*.c")):
        obj = tmp_path / f"{source.name}.o"
        cmd = ["gcc", "-c", *flags, "-I", str(KERNELS), str(source), "-o", str(obj)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
        table[source.name] = symbols(obj)
    return {a: {b for b, (defined_b, _) in table.items()
                if b != a and undefined_a & defined_b}
            for a, (_, undefined_a) in table.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest loop a -> ... -> a through every strongly connected component of two TUs
    or more: the Tarjan and loop search of `tools/import_graph.py`, on the TU graph."""
    edges = {(a, b): [] for a, targets in graph.items() for b in targets}
    found = []
    for component in import_graph.strongly_connected(graph, set(edges)):
        if len(component) > 1:
            members = set(component)
            inner = {e: [] for e in edges if e[0] in members and e[1] in members}
            found.append(import_graph.Cycle("aicpu_kernels", component, inner).shortest_loop())
    return found


def test_cycle_finder_names_the_cycle():
    graph = {"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": {"a.c", "d.c"}, "d.c": set()}
    assert cycles(graph) == [["a.c", "b.c", "c.c", "a.c"]]
    assert cycles({"a.c": {"b.c"}, "b.c": set()}) == []


def test_no_translation_units_reference_each_other(tmp_path):
    graph = tu_graph(tmp_path)
    found = cycles(graph)
    described = "; ".join(" -> ".join(cycle) for cycle in found)
    assert not found, f"symbol cycles between aicpu_kernels/ translation units: {described}"
