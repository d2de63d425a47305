"""Every module of `pyruntime/` is reached: another module imports it, or the table names its way in.

A module that no other module imports (`tools/import_graph.py`'s edges: literal imports,
function-level ones included) is either reached another way (an entry point, a loader that
builds the name from a string) or dead, like the two alias modules of the issue-31 sweep
(docs/design.md, section 9). `REACHED_BY_NAME` gives each module of the first kind the file
that reaches it and the text there that names it. The test fails on a module that is neither
imported nor in the table (give it a home or delete it), and on a table entry whose file no
longer names it or that is now imported normally (delete the entry). Nothing is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import import_graph as graph  # from tools/, on the path above

#: module -> (the file that reaches it, the text in that file that names it)
REACHED_BY_NAME = {
    # the backend registry imports its backends by name (`pyruntime.backends.get`)
    "pyruntime.backends.cpu": ("pyruntime/backends/__init__.py", '"pyruntime.backends.cpu"'),
    "pyruntime.backends.npu": ("pyruntime/backends/__init__.py", '"pyruntime.backends.npu"'),
    # `python -m pyruntime.cli.aarch64`, the documented command line of the AArch64 build
    "pyruntime.cli.aarch64": ("docs/aicpu-kernel.md", "python -m pyruntime.cli.aarch64"),
    # the .pth lines import them at interpreter start-up
    "pyruntime.hook.autostart": ("pyruntime/hook/pth.py", "'pyruntime.hook.autostart'"),
    "pyruntime.npu_twin.autostart": ("pyruntime/npu_twin/pth.py",
                                     '"pyruntime.npu_twin.autostart"'),
    # the dry-run driver imports f"{__package__}.{shape.geometry}"
    "pyruntime.hook.dryrun.gqa": ("pyruntime/hook/dryrun/models.py",
                                  'geometry: ClassVar[str] = "gqa"'),
    "pyruntime.hook.dryrun.mla": ("pyruntime/hook/dryrun/models.py",
                                  'geometry: ClassVar[str] = "mla"'),
    # the Triton launchers import their @triton.jit module by name, when a kernel launches
    "pyruntime.kernels.triton_mla": ("pyruntime/kernels/triton_mla_launch.py",
                                     '_KERNELS = "pyruntime.kernels.triton_mla"'),
    # the self-check imports each check's module when the check runs (`_deferred`)
    "pyruntime.selfcheck.attention_checks": ("pyruntime/selfcheck/__init__.py",
                                             '_deferred("attention_checks", '),
    "pyruntime.selfcheck.mla_checks": ("pyruntime/selfcheck/__init__.py",
                                       '_deferred("mla_checks", '),
    "pyruntime.selfcheck.stale_read": ("pyruntime/selfcheck/__init__.py",
                                       '_deferred("stale_read", '),
}


def _with_packages(names: set[str]) -> set[str]:
    """`names` and every package above them: importing a module runs its packages first."""
    out = set()
    for name in names:
        parts = name.split(".")
        out.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return out


def unreached(root: Path = graph.ROOT) -> set[str]:
    """The modules of the package at `root` that no other one imports, less ``__main__``
    modules (``python -m``'s) and the packages of imported modules."""
    modules = graph.module_files(root)
    imported = {i.target for i in graph.module_imports(modules, root)}
    reached = _with_packages(imported | set(REACHED_BY_NAME))
    return {m for m in modules if m not in reached and not m.endswith(".__main__")
            and m != graph.PACKAGE}


def test_every_pyruntime_module_is_imported_or_named_as_a_way_in():
    modules = graph.module_files()
    imported = {i.target for i in graph.module_imports(modules)}
    orphans = sorted(unreached())
    assert orphans == [], (
        f"no module imports {orphans}: import it where it is used, add its way in to "
        "REACHED_BY_NAME (an entry point, a name a loader builds), or delete it")
    stale = sorted(m for m in REACHED_BY_NAME if m not in modules or m in imported)
    assert stale == [], f"REACHED_BY_NAME lists modules that are gone or imported: {stale}"
    unnamed = sorted(m for m, (path, text) in REACHED_BY_NAME.items()
                     if text not in (ROOT / path).read_text())
    assert unnamed == [], f"these files no longer name their module: {unnamed}"


def test_an_alias_module_that_nothing_imports_is_found(tmp_path):
    root = tmp_path / "pyruntime"
    (root / "cli").mkdir(parents=True)
    (root / "measurement").mkdir()
    for name, text in {
        "__init__.py": "",
        "cli/__init__.py": "from pyruntime.measurement import abrun\n",
        "cli/__main__.py": "from . import main\n",
        # the shape of the removed pyruntime/cli/abrun.py: imports, but nothing imports it
        "cli/abrun.py": "import sys\nfrom pyruntime.measurement import abrun\n"
                        "sys.modules[__name__] = abrun\n",
        "measurement/__init__.py": "",
        "measurement/abrun.py": "",
    }.items():
        (root / name).write_text(text)
    assert unreached(root) == {"pyruntime.cli.abrun"}
