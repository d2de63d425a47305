"""vLLM-Ascend's Python sources read without importing them: from a wheel (zip), an sdist
(tar.gz) or the fixture folder, parsed with ``ast`` on demand. Shared by the conformance
tests (``test_conformance.py``, ``test_release_conformance.py``)."""

from __future__ import annotations

import ast
import functools
import tarfile
import zipfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Source:
    """Python sources of one tree (a wheel, an sdist or the fixture folder), parsed on demand.

    `read` maps a module name to its parsed tree (or None); `raw`, where given, maps a
    package-relative path (``vllm_ascend/x.py``) to its bytes."""

    def __init__(self, read, raw=None):
        self._read = read
        self._raw = raw
        self._trees = {}

    def tree(self, module):
        if module not in self._trees:
            self._trees[module] = self._read(module)
        return self._trees[module]

    def raw(self, path):
        return self._raw(path) if self._raw else None


def _module_paths(module):
    base = module.replace(".", "/")
    return (f"{base}.py", f"{base}/__init__.py")


def _tree_source(files):
    """A Source over `files`: package-relative path -> bytes."""

    def read(module):
        for path in _module_paths(module):
            if path in files:
                return ast.parse(files[path])
        return None

    return Source(read, files.get)


def wheel_source(zf):
    """(Source, names) of a wheel opened as a ZipFile; names are the archive's paths."""
    names = set(zf.namelist())

    def read(module):
        for path in _module_paths(module):
            if path in names:
                return ast.parse(zf.read(path))
        return None

    return Source(read, lambda path: zf.read(path) if path in names else None), names


def sdist_files(path):
    """Package-relative path -> bytes of every ``.py`` file under the sdist's top folder
    (``vllm_ascend-<version>/``), read in one pass of the tar.gz."""
    files = {}
    with tarfile.open(path, "r:gz") as tf:
        for member in tf:
            if not (member.isfile() and member.name.endswith(".py")):
                continue
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            files[rel] = tf.extractfile(member).read()
    return files


@functools.cache
def archive_source(path):
    """(Source, names) of a wheel or an sdist, cached per path for the session."""
    path = Path(path)
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as zf:
            files = {n: zf.read(n) for n in zf.namelist() if n.endswith(".py")}
    else:
        files = sdist_files(path)
    return _tree_source(files), set(files)


def fixture_source():
    def read(module):
        base = FIXTURES / module.replace(".", "/")
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.exists():
                return ast.parse(path.read_text())
        return None

    return Source(read)


def find_def(tree, qualname):
    node = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node


def param_names(fn):
    a = fn.args
    return tuple(p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs])


def importers_by_name(names, src, name="update_full_graph_params"):
    """Modules of the ``vllm_ascend`` package that bind `name` with ``from ... import``."""
    found = set()
    for path in names:
        if not (path.startswith("vllm_ascend/") and path.endswith(".py")):
            continue
        raw = src.raw(path)
        if raw is not None and name.encode() not in raw:
            continue  # cannot import it by name: skip the parse
        module = path[:-3].replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(src.tree(module)):
            if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                found.add(module)
    return found
