"""The two start-up paths (the .pth line, vLLM's general plugin) never raise and never print
a traceback: a broken install gives one stderr line, and importing the hook package costs
nothing until an export is used."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyruntime import hook
from pyruntime.hook import activation, registry, vllm_plugin
from pyruntime.hook.pth import _WARNED, PTH_FILENAME, pth_content, unknown_value_warning

REPO = Path(__file__).resolve().parents[2]
# a module set to None in sys.modules raises ModuleNotFoundError on import: a venv without it
BLOCK_PACKAGING = "import sys; sys.modules['packaging'] = None; "
THIRD_PARTY = ("packaging", "torch", "numpy", "rich", "cffi", "_cffi_backend")


def _python(tmp_path, code, **env):
    """Run ``code`` in a fresh interpreter importing this checkout; site dir = argv[1]."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / PTH_FILENAME).write_text(pth_content())
    base = {k: v for k, v in os.environ.items() if not k.startswith("AICPU_TILING")}
    base["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code, str(site_dir)], env={**base, **env},
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out


def test_importing_the_hook_package_imports_nothing_else(tmp_path):
    out = _python(tmp_path, "import sys, pyruntime.hook, pyruntime.hook.vllm_plugin; "
                  f"print(sorted(m for m in sys.modules if m.split('.')[0] in {THIRD_PARTY!r} "
                  "or m.startswith('pyruntime')))")
    assert out.stdout.strip() == str(["pyruntime", "pyruntime.hook", "pyruntime.hook.vllm_plugin"])


def test_the_lazy_exports_are_the_real_objects():
    assert hook.install is activation.install and hook.status is activation.status
    assert "install" in dir(hook) and set(hook.__all__) <= set(dir(hook))
    with pytest.raises(AttributeError, match="no attribute 'instal'"):
        hook.instal  # noqa: B018


def test_pth_start_with_a_missing_dependency_prints_one_line_and_no_traceback(tmp_path):
    out = _python(tmp_path, BLOCK_PACKAGING + "import site; site.addsitedir(sys.argv[1]); "
                  "print('started')", AICPU_TILING="1")
    assert out.stdout.strip() == "started"
    assert "Traceback" not in out.stderr and "Error processing" not in out.stderr, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("aicpu-tiling: hook not installed: ModuleNotFoundError") and \
        "'packaging" in line, line


def test_plugin_with_a_missing_dependency_prints_one_line_and_returns(tmp_path):
    out = _python(tmp_path, BLOCK_PACKAGING + "from pyruntime.hook.vllm_plugin import register; "
                  "register(); print('vllm goes on')", AICPU_TILING="1")
    assert out.stdout.strip() == "vllm goes on"
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("aicpu-tiling: hook not installed: ModuleNotFoundError")


@pytest.mark.parametrize("value", [None, "", "0", "off", "No"])
def test_plugin_off_values_import_nothing_and_say_nothing(tmp_path, value):
    env = {} if value is None else {"AICPU_TILING": value}
    out = _python(tmp_path, "import sys; from pyruntime.hook.vllm_plugin import register; "
                  "register(); print('pyruntime.hook.activation' in sys.modules)", **env)
    assert out.stdout.strip() == "False" and out.stderr == ""


@pytest.mark.parametrize("value", ["1", "true", " ON "])
def test_plugin_on_values_install_the_hook(monkeypatch, value):
    monkeypatch.setenv("AICPU_TILING", value)
    assert not hook.is_installed()
    vllm_plugin.register()
    assert hook.is_installed() and hook.status().installed
    hooks = registry.registered()
    vllm_plugin.register()  # vLLM may call it again in the same process: still one install
    assert registry.registered() == hooks and all(n == 1 for n in hooks.values())


def test_plugin_unknown_value_warns_once_per_process(monkeypatch, capsys):
    monkeypatch.setenv("AICPU_TILING", "maybe")
    monkeypatch.delattr(sys, _WARNED, raising=False)
    vllm_plugin.register()
    vllm_plugin.register()
    assert capsys.readouterr().err.splitlines() == [unknown_value_warning("maybe")]
    assert not hook.is_installed()


def test_plugin_and_pth_share_the_one_warning(tmp_path):
    # a regular install runs both paths in a vLLM process: the user reads the line once
    out = _python(tmp_path, "import site, sys; site.addsitedir(sys.argv[1]); "
                  "from pyruntime.hook.vllm_plugin import register; register()",
                  AICPU_TILING="maybe")
    assert out.stderr.splitlines() == [unknown_value_warning("maybe")]


def test_plugin_is_registered_in_pyproject():
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    plugins = meta["entry-points"][vllm_plugin.GROUP]
    assert plugins == {vllm_plugin.NAME: "pyruntime.hook.vllm_plugin:register"}
