"""What an install brings: declared dependencies, every module importable, the hook's start-up.

Fast checks (always run): every third-party import in ``pyruntime`` is declared (required or
an extra) or provided by the NPU machine; the README's NPU install line installs exactly the
declared dependencies but torch.

Install checks (``-m install``, about a minute): one venv per session WITHOUT system site
packages, holding only torch 2.13.0 (CPU, found locally); each test installs into it and
leaves it as it found it.

- the wheel with its declared dependencies (pip resolves them from the wheel's metadata):
  every module that needs no extra imports, and ``AICPU_TILING=1 python -c pass`` prints
  nothing;
- the README's NPU recipe as written (``pip install --no-deps -e . && pip install ...``):
  torch unchanged, no ``.pth`` file, and vLLM's plugin loader finds our
  ``vllm.general_plugins`` entry point, whose call with ``AICPU_TILING=1`` installs the hook.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE = REPO / "pyruntime"

#: import name -> distribution name, where they differ
DISTRIBUTIONS = {"elftools": "pyelftools", "_cffi_backend": "cffi", "vllm_ascend": "vllm-ascend"}
#: imported only where the NPU machine or vLLM(-Ascend) provides them: never declared, since
#: a requirement on torch_npu, vllm or vllm-ascend would let pip replace the NPU machine's torch;
#: transformers and safetensors are vLLM's own requirements, imported only by serve-check's
#: engine check (pyruntime/hook/dryrun/tiny_models.py, engine_check.py), which runs where vLLM is
PROVIDED_BY_HOST = {"torch_npu", "vllm", "vllm-ascend", "transformers", "safetensors"}
#: modules that import an optional extra at module level (the rest import with the required
#: dependencies alone); module -> the extra's distribution
OPTIONAL_MODULES = {"pyruntime.kernels.triton_attention": "triton",
                    "pyruntime.kernels.triton_mla": "triton"}


def _requirement_name(spec: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower().replace("_", "-")


REQUIRED = {_requirement_name(s) for s in PYPROJECT["project"]["dependencies"]}
EXTRAS = {_requirement_name(s) for specs in PYPROJECT["project"]["optional-dependencies"].values()
          for s in specs}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _third_party_imports():
    """Yield (module, distribution, at_module_level) for every non-stdlib, non-pyruntime import."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top in sys.stdlib_module_names or top in ("pyruntime", "__future__"):
                    continue
                yield _module_name(path), DISTRIBUTIONS.get(top, top).lower(), id(node) in top_level


def test_every_third_party_import_is_declared_or_provided_by_the_host():
    undeclared = sorted({(mod, dist) for mod, dist, _ in _third_party_imports()
                         if dist not in REQUIRED | EXTRAS | PROVIDED_BY_HOST})
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    assert "packaging" in REQUIRED  # pyruntime/hook/versions.py, the hook's version check


def test_only_the_listed_modules_need_an_extra_at_import():
    needs_extra = {mod: dist for mod, dist, top in _third_party_imports()
                   if top and dist not in REQUIRED}
    assert needs_extra == OPTIONAL_MODULES


def _readme_npu_install_line() -> str:
    readme = (REPO / "README.md").read_text()
    npu = readme[readme.index("## On an Ascend NPU"):]
    lines = [line for line in npu.splitlines() if line.startswith("pip install")]
    assert len(lines) == 1, f"expected one pip line in the NPU section, got {lines}"
    return lines[0].split("#")[0].strip()


def test_readme_npu_line_installs_the_declared_dependencies_and_never_torch():
    line = _readme_npu_install_line()
    commands = [c.split() for c in line.split("&&")]
    assert commands[0] == ["pip", "install", "--no-deps", "-e", "."], line
    named = {_requirement_name(w) for c in commands[1:] for w in c[2:] if not w.startswith("-")}
    assert named == REQUIRED - {"torch"}, line
    assert "torch" not in line, "the NPU recipe must keep the machine's torch (and torch_npu's)"


# ---- install checks ------------------------------------------------------------------------

_SKIP_COPY = shutil.ignore_patterns(".git", "build", "dist", "__pycache__", "*.egg-info", "*.so",
                                    "*.o", ".pytest_cache", ".hypothesis", ".ruff_cache", ".cache")


def _run(args, *, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, f"{args} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


class Venv:
    """A venv without system site packages; `env` puts its bin first on PATH."""

    def __init__(self, root: Path) -> None:
        self.root, self.python = root, root / "bin" / "python"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("AICPU_TILING", "PYTHON", "VIRTUAL_ENV", "VLLM_"))}
        self.env["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env["VIRTUAL_ENV"] = str(root)

    def pip(self, *args, cwd) -> None:
        _run([str(self.python), "-m", "pip", "install", "--quiet", *args], cwd=cwd, env=self.env)

    def distributions(self) -> set[str]:
        out = _run([str(self.python), "-c", "import importlib.metadata as m; "
                    "print('\\n'.join(sorted({d.metadata['Name'] for d in m.distributions()})))"],
                   cwd=self.root, env=self.env)
        return set(out.stdout.split())

    def python_c(self, code: str, *, cwd, **env) -> subprocess.CompletedProcess:
        return _run([str(self.python), "-c", code], cwd=cwd, env={**self.env, **env}, timeout=120)


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory):
    """One venv per session holding only pip and torch 2.13.0 (the CPU build found locally)."""
    root = tmp_path_factory.mktemp("install") / "venv"
    _run([sys.executable, "-m", "venv", str(root)], cwd=root.parent)
    venv = Venv(root)
    venv.pip("torch==2.13.0", cwd=root.parent)
    return venv


@pytest.fixture
def clean_venv(bare_venv):
    """The session venv; whatever a test installed into it is uninstalled afterwards."""
    before = bare_venv.distributions()
    yield bare_venv
    added = sorted(bare_venv.distributions() - before)
    if added:
        _run([str(bare_venv.python), "-m", "pip", "uninstall", "--yes", "--quiet", *added],
             cwd=bare_venv.root, env=bare_venv.env)


@pytest.fixture(scope="session")
def source_copy(tmp_path_factory):
    """The working tree without build outputs, so nothing is built into the checkout."""
    copy = tmp_path_factory.mktemp("src") / "aicpu-tiling"
    shutil.copytree(REPO, copy, ignore=_SKIP_COPY)
    return copy


IMPORT_ALL = """
import importlib, json, pkgutil, sys
import pyruntime
skip = set(json.loads(sys.argv[1]))
imported, failed = [], {}
for info in pkgutil.walk_packages(pyruntime.__path__, "pyruntime."):
    if info.name in skip or info.name.endswith(".__main__"):  # __main__: scripts, not imports
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except Exception as exc:
        failed[info.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"file": pyruntime.__file__, "imported": imported, "failed": failed}))
"""


@pytest.mark.install
def test_wheel_in_a_bare_venv_imports_everything_and_starts_quietly(clean_venv, source_copy,
                                                                    tmp_path):
    venv = clean_venv
    assert not {"numpy", "cffi", "rich", "packaging"} & {d.lower() for d in venv.distributions()}
    wheels = tmp_path / "wheels"
    _run([str(venv.python), "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
          str(source_copy)], cwd=tmp_path, env=venv.env)
    (wheel,) = wheels.glob("aicpu_tiling-*.whl")
    venv.pip(str(wheel), cwd=tmp_path)  # the declared dependencies come from its metadata

    code = IMPORT_ALL.replace("sys.argv[1]", repr(json.dumps(sorted(OPTIONAL_MODULES))))
    report = json.loads(venv.python_c(code, cwd=tmp_path).stdout)
    assert report["file"].startswith(str(venv.root)), report["file"]
    assert report["failed"] == {}
    assert "pyruntime.hook.versions" in report["imported"] and len(report["imported"]) > 50

    for value in ("1", "0", ""):
        started = venv.python_c("pass", cwd=tmp_path, AICPU_TILING=value)
        assert started.stderr == "" and started.stdout == "", (value, started.stderr)
    hooked = venv.python_c("import pyruntime.hook as h; print(h.status().installed)",
                           cwd=tmp_path, AICPU_TILING="1")
    assert hooked.stdout.strip() == "True" and hooked.stderr == ""  # the .pth did it


PLUGIN_CHECK = """
import importlib.metadata as md, json, sys
found = [ep for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "aicpu_tiling"]
for ep in found:  # what vllm.plugins.load_general_plugins does with each
    ep.load()()
loaded = "pyruntime.hook.activation" in sys.modules  # before status() imports it
import pyruntime, pyruntime.hook
print(json.dumps({"eps": [ep.value for ep in found], "loaded": loaded,
                  "installed": pyruntime.hook.status().installed,
                  "file": pyruntime.__file__, "torch": md.version("torch"),
                  "pth": [p for p in sys.path if p.endswith("site-packages")]}))
"""


@pytest.mark.install
def test_readme_npu_recipe_editable_activates_through_the_vllm_plugin(clean_venv, source_copy,
                                                                      tmp_path):
    venv = clean_venv
    torch_before = venv.python_c("import importlib.metadata as m; print(m.version('torch'))",
                                 cwd=tmp_path).stdout.strip()
    line = _readme_npu_install_line()
    _run(["bash", "-c", line], cwd=source_copy, env=venv.env)  # `pip` is the venv's (PATH)

    started = venv.python_c(PLUGIN_CHECK, cwd=tmp_path, AICPU_TILING="1")
    on = json.loads(started.stdout)
    assert on["eps"] == ["pyruntime.hook.vllm_plugin:register"]
    assert on["loaded"] is True and on["installed"] is True and started.stderr == ""
    assert on["file"].startswith(str(source_copy)), on["file"]  # editable: imports the source
    assert on["torch"] == torch_before
    site = [Path(p) for p in on["pth"]]
    assert site and not any((p / "aicpu_tiling_hook.pth").exists() for p in site), \
        "an editable install has no .pth: the plugin alone installed the hook"

    unset = venv.python_c(PLUGIN_CHECK, cwd=tmp_path)  # AICPU_TILING unset: a no-op
    off = json.loads(unset.stdout)
    assert off["eps"] == on["eps"] and unset.stderr == ""
    assert off["loaded"] is False and off["installed"] is False


#: what the NPU twin needs beyond the NPU recipe: the AArch64 build and its emulator, and
#: upstream Triton in the place of the triton-ascend that vLLM-Ascend brings on an NPU
#: machine (the twin runs our Triton kernels' bodies); the ``test`` extra's requirements
TWIN_EXTRAS = [r for r in PYPROJECT["project"]["optional-dependencies"]["test"]
               if _requirement_name(r) in {"ziglang", "unicorn", "pyelftools", "triton"}]


@pytest.mark.install
def test_readme_npu_recipe_runs_its_selfcheck_on_the_twin(clean_venv, source_copy, tmp_path):
    # The NPU recipe as far as a machine without CANN goes: the install line as written, then
    # step 3a's selfcheck with the twin standing in for torch_npu and CANN (step 2 builds with
    # CANN; the twin builds its own AI-CPU binary with ziglang).
    venv = clean_venv
    _run(["bash", "-c", _readme_npu_install_line()], cwd=source_copy, env=venv.env)
    assert len(TWIN_EXTRAS) == 4, TWIN_EXTRAS
    venv.pip(*TWIN_EXTRAS, cwd=tmp_path)
    report = tmp_path / "placement.json"
    _run([str(venv.root / "bin" / "aicpu-tiling"), "selfcheck", "--backend", "npu-twin",
          "--checks", "tiling_kernel,aicpu_replay", "-o", str(report), "--no-progress"],
         cwd=tmp_path, env={**venv.env, "TASK_QUEUE_ENABLE": "1"}, timeout=600)
    checks = {c["name"]: c["status"] for c in json.loads(report.read_text())["checks"]}
    assert checks == {"kernels": "pass", "tiling_kernel": "pass", "aicpu_replay": "pass"}
