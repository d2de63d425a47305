"""The NPU twin in every process that asks for it (issue 28, item 3): the ``.pth`` line and
``AICPU_TILING_TWIN``, in an editable install (this checkout on ``PYTHONPATH``).

The start-up file goes where an editable install's user would put it with
``python -m pyruntime.npu_twin.pth install --user``: a user site folder (``PYTHONUSERBASE``,
a fresh one per test), which ``site`` processes at every interpreter start of this Python
before the base interpreter's site-packages. The children are real interpreter starts; the
vLLM side (model inspection, vLLM's multiprocessing) is in ``test_processes_in_vllm.py``.
"""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

from pyruntime.hook import pth as hook_pth
from pyruntime.npu_twin import STATE_ENV, pth
from pyruntime.npu_twin.device import BAD_FORK

REPO = Path(__file__).resolve().parents[2]
PROBE_DIR = Path(__file__).resolve().parent  # twin_processes_probe.py, importable by name
FACTS = "FACTS "
#: a module the test puts into the user site with a .pth that sorts first: when the hook's
#: autostart module is about to be imported, it notes whether the twin is active already
ORDER_PROBE = '''
import sys


class _TwinAtHookAutostart:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pyruntime.hook.autostart" and not hasattr(sys, "_twin_at_hook_autostart"):
            twin = sys.modules.get("pyruntime.npu_twin")
            torch = sys.modules.get("torch")
            sys._twin_at_hook_autostart = bool(
                twin is not None and twin.is_active() and torch is not None
                and torch.npu is sys.modules.get("pyruntime.npu_twin.npu_module"))
        return None


sys.meta_path.insert(0, _TwinAtHookAutostart)
'''


def _base_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AICPU_TILING", "VLLM_")) and k != "PYTHONHOME"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(PROBE_DIR)])
    return env


def _user_site(base: Path) -> Path:
    """The user site folder of this Python for ``PYTHONUSERBASE=base``."""
    out = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                         env={**_base_env(), "PYTHONUSERBASE": str(base)}, capture_output=True,
                         text=True, timeout=60, check=True)
    return Path(out.stdout.strip())


def _facts(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith(FACTS)]
    assert lines, stdout[-2000:]
    return json.loads(lines[-1][len(FACTS):])


# ---- the file and its line ---------------------------------------------------------------------
def test_the_pth_file_runs_after_editable_finders_and_before_the_hooks_line():
    # site runs one folder's .pth files in sorted order: setuptools' __editable__.*.pth makes
    # an editable pyruntime importable, the hook's line must find the twin active
    assert "__editable__.aicpu_tiling-0.1.0.pth" < pth.PTH_FILENAME < hook_pth.PTH_FILENAME
    assert sorted([hook_pth.PTH_FILENAME, pth.PTH_FILENAME, "distutils-precedence.pth",
                   "__editable__.x.pth"]).index(pth.PTH_FILENAME) == 1


def _run_line(tmp_path, value, prefix=""):
    """Execute the .pth line at a site folder in a fresh interpreter; stdout lists which of
    our modules and torch it imported."""
    folder = tmp_path / "site"
    folder.mkdir(exist_ok=True)
    (folder / pth.PTH_FILENAME).write_text(pth.pth_content())
    env = _base_env()
    if value is not None:
        env[pth.ENV_VAR] = value
    code = (prefix + "import site, sys; site.addsitedir(sys.argv[1]); site.addsitedir(sys.argv[1]); "
            "print(sorted(m for m, mod in sys.modules.items() "
            "if mod is not None and (m.startswith('pyruntime') or m == 'torch')))")
    # -S: the interpreter's own site-packages (where an install, or .ci/run's venv, may hold
    # the same line) is not processed at start, so only this folder's copy of the line runs
    return subprocess.run([sys.executable, "-S", "-c", code, str(folder)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.parametrize("value", [None, "", "0", "off", " No "])
def test_off_values_import_nothing_and_say_nothing(tmp_path, value):
    out = _run_line(tmp_path, value)
    assert out.stdout.strip() == "[]" and out.stderr == ""


def test_an_unknown_value_imports_nothing_and_warns_once(tmp_path):
    out = _run_line(tmp_path, "twin")  # the line runs twice (as in a system-site venv)
    assert out.stdout.strip() == "[]"
    assert out.stderr.splitlines() == [pth.unknown_value_warning("twin")]
    assert "AICPU_TILING_TWIN='twin'" in out.stderr and "1/true/yes/on" in out.stderr


def test_on_without_an_importable_pyruntime_says_so_in_one_line(tmp_path):
    # a venv that has the line but not the checkout on its path: interpreter start goes on
    out = _run_line(tmp_path, "1", prefix="import sys; sys.modules['pyruntime'] = None; ")
    assert out.stdout.strip() == "[]"
    assert out.stderr.splitlines() == [pth.not_importable_warning()]  # once, as site ran it twice
    assert "Traceback" not in out.stderr


def test_install_is_idempotent_and_replaces_an_outdated_file(tmp_path):
    path, written = pth.install(tmp_path)
    assert (path, written) == (tmp_path / pth.PTH_FILENAME, True)
    assert path.read_text() == pth.pth_content() and pth.installed(tmp_path)
    assert pth.install(tmp_path) == (path, False)
    path.write_text("import os\n")  # an older line
    assert not pth.installed(tmp_path)
    assert pth.install(tmp_path) == (path, True) and pth.installed(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [pth.PTH_FILENAME]  # no temp left
    with pytest.raises(FileNotFoundError, match="no site-packages folder"):
        pth.install(tmp_path / "missing")
    assert pth.main(["check", str(tmp_path)]) == 0
    assert pth.main(["check", str(tmp_path / "missing")]) == 1
    assert pth.main(["remove"]) == 2


def test_vllm_env_script_installs_the_pth_into_a_cached_env(tmp_path):
    """tools/vllm_env.sh on a finished env (READY.json of the current recipe) writes the
    .pth into its venv and rebuilds nothing; a second call finds it up to date."""
    release = "9.9.9"
    env_dir = tmp_path / "envs" / release
    env_dir.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir / "venv")],
                   check=True, timeout=300)
    script = (REPO / "tools" / "vllm_env.sh").read_text()
    recipe = re.search(r"^RECIPE=(\d+)", script, re.MULTILINE).group(1)
    (env_dir / "READY.json").write_text(f'{{"recipe": {recipe}, "release": "{release}"}}')
    env = {**_base_env(), "AICPU_TILING_VLLM_ENVS": str(tmp_path / "envs")}
    site_dir = Path(subprocess.run(
        [str(env_dir / "venv" / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    assert not pth.installed(site_dir)
    for state in ("written", "up to date"):
        out = subprocess.run(["bash", str(REPO / "tools" / "vllm_env.sh"), release], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr
        assert f"{site_dir / pth.PTH_FILENAME}: {state}" in out.stderr, out.stderr
        assert f"vllm_env: {release} ready (cached)" in out.stdout, out.stdout
        assert pth.installed(site_dir)
    assert sorted(p.name for p in env_dir.iterdir()) == ["READY.json", "venv"]  # nothing built


def test_ci_runs_the_vllm_env_script_and_installs_the_pth_in_its_own_venv():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"for release in 0\.23\.0\.post1 0\.30\.0rc2; do\n\s+if ! bash "
                     r"tools/vllm_env\.sh \"\$release\"", ci)
    assert "python3 -m pyruntime.npu_twin.pth install\n" in ci


# ---- a process tree ------------------------------------------------------------------------------
TREE_SCRIPT = r'''
import json, multiprocessing, os, select, subprocess, sys
from pathlib import Path

import torch

from pyruntime import hook
from twin_processes_probe import facts_from_a_child, twin_facts

out = {"parent": twin_facts(), "hook_installed": hook.is_installed(),
       "twin_at_hook_autostart": getattr(sys, "_twin_at_hook_autostart", None)}
child = subprocess.run([sys.executable, "-c", "import json; from twin_processes_probe import "
                        "facts_using_the_device as f; print('FACTS ' + json.dumps(f()))"],
                       capture_output=True, text=True, timeout=600)
out["subprocess"] = json.loads(child.stdout.split("FACTS ")[-1]) if "FACTS " in child.stdout \
    else {"stderr": child.stderr[-2000:]}
fork = multiprocessing.get_context("fork")
out["fork_before_device_use"] = facts_from_a_child(fork)
state = Path(os.environ["AICPU_TILING_TWIN_STATE"])
torch.npu.synchronize()  # the parent's device thread runs
out["fork_after_device_use"] = facts_from_a_child(fork)

# a bare os.fork() child that exits normally: its inherited atexit handlers run
pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)
out["state_dir_after_bare_fork_exit"] = state.is_dir()

# a bare os.fork() child that synchronises: the parent's device thread does not exist there
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read_end)
    torch.npu.synchronize()
    os.write(write_end, b"synchronized")
    os._exit(0)
os.close(write_end)
ready, _, _ = select.select([read_end], [], [], 120)
out["bare_fork_synchronized"] = bool(ready) and os.read(read_end, 64) == b"synchronized"
if not ready:
    os.kill(pid, 9)
os.waitpid(pid, 0)
out["parent_after"] = twin_facts(use_device=True)
print("FACTS " + json.dumps(out))
'''


def _with_the_pth_in_a_user_site(tmp_path) -> tuple[dict, Path]:
    """(an environment whose interpreters start with a fresh user site holding the twin's
    .pth, installed as a user would; that folder)."""
    if not site.ENABLE_USER_SITE:
        pytest.skip("this Python has no user site folder (a venv without system site "
                    "packages): the test installs the .pth there")
    base = tmp_path / "userbase"
    env = {**_base_env(), "PYTHONUSERBASE": str(base)}
    installed = subprocess.run([sys.executable, "-m", "pyruntime.npu_twin.pth", "install",
                                "--user"], env=env, capture_output=True, text=True,
                               timeout=120, check=False)
    assert installed.returncode == 0, installed.stderr
    user_site = _user_site(base)
    assert pth.installed(user_site)
    return env, user_site


def test_every_process_of_a_tree_has_the_twin_and_it_starts_before_the_hook(tmp_path):
    env, user_site = _with_the_pth_in_a_user_site(tmp_path)
    # as a regular install of the hook would have it, plus the order probe (sorted first)
    (user_site / hook_pth.PTH_FILENAME).write_text(hook_pth.pth_content())
    (user_site / "twin_order_probe.py").write_text(ORDER_PROBE)
    (user_site / "00_twin_order_probe.pth").write_text("import twin_order_probe\n")

    # The hook's start needs `packaging`, which this Python may have only in its base
    # site-packages, which site adds after the user site: a folder with just that package
    # on PYTHONPATH lets the hook start there (torch stays where it is, added after the user
    # site, and the twin's start finds it by itself).
    import packaging

    early = tmp_path / "early"
    early.mkdir()
    (early / "packaging").symlink_to(Path(packaging.__file__).parent, target_is_directory=True)
    env["PYTHONPATH"] += os.pathsep + str(early)
    env.update({pth.ENV_VAR: "1", hook_pth.ENV_VAR: "1"})
    proc = subprocess.run([sys.executable, "-c", TREE_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aicpu-tiling:" not in proc.stderr, proc.stderr  # no warning, no failed start
    facts = _facts(proc.stdout)

    parent = facts["parent"]
    assert parent["active"] and parent["torch_npu_is_twin"], facts
    # both autostarts ran at interpreter start, the twin's first
    assert facts["hook_installed"] is True
    assert facts["twin_at_hook_autostart"] is True, facts
    # a fresh interpreter started by subprocess: the variable is inherited, the .pth runs
    child = facts["subprocess"]
    assert child.get("active") and child["torch_npu_is_twin"], child
    assert child["device_sum"] == 6.0 and child["pid"] != parent["pid"]
    # multiprocessing fork children inherit the activated twin; before the parent used its
    # device the child's device is clean, after it torch_npu's fork rule refuses it
    clean = facts["fork_before_device_use"]
    assert clean["active"] and clean["torch_npu_is_twin"] and clean["device_sum"] == 6.0, clean
    refused = facts["fork_after_device_use"]
    assert refused["active"] and refused["device_error"] == f"RuntimeError: {BAD_FORK}", refused
    # a bare fork child's exit leaves the parent's state directory alone, and it does not
    # wait on the parent's device thread
    assert facts["state_dir_after_bare_fork_exit"] is True
    assert facts["bare_fork_synchronized"] is True
    assert facts["parent_after"]["device_sum"] == 6.0
    assert STATE_ENV == "AICPU_TILING_TWIN_STATE"


#: a stand-in for ``python -m ziglang``: notes what it saw and fails like a broken compiler
FAKE_ZIG = """
import os, sys
twin = sys.modules.get("pyruntime.npu_twin")
with open(os.environ["FAKE_ZIG_LOG"], "a") as log:
    log.write(f"{os.environ.get('AICPU_TILING_TWIN')} {bool(twin and twin.is_active())}\\n")
sys.exit("fake ziglang: no compiler here")
"""
#: sorted before the twin's line: past three nested interpreters it turns the twin off, so a
#: start that recurses (each compiler run activating a twin that compiles) stops
DEPTH_GUARD = ("import os; depth = int(os.environ.get('TWIN_TEST_DEPTH', '0')) + 1; "
               "os.environ['TWIN_TEST_DEPTH'] = str(depth); "
               "depth > 3 and os.environ.__setitem__('AICPU_TILING_TWIN', '0')\n")


def test_the_twins_own_compiler_runs_do_not_start_a_twin(tmp_path):
    """With a cold build cache, activation runs ``python -m ziglang``: a Python process,
    which must not activate a twin of its own (that one would build again, without end)."""
    env, user_site = _with_the_pth_in_a_user_site(tmp_path)
    (user_site / "00_depth_guard.pth").write_text(DEPTH_GUARD)
    fake = tmp_path / "fake" / "ziglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_ZIG)
    log = tmp_path / "zig.log"
    env.update({pth.ENV_VAR: "1", "FAKE_ZIG_LOG": str(log),
                "AICPU_TILING_BUILD_DIR": str(tmp_path / "build"),  # a cold cache
                "PYTHONPATH": os.pathsep.join([str(fake.parent), env["PYTHONPATH"]])})
    code = ("import os, sys; twin = sys.modules.get('pyruntime.npu_twin'); "
            "print('FACTS', bool(twin and twin.is_active()), os.environ['AICPU_TILING_TWIN'])")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one compiler run, which saw the variable off and started no twin
    assert log.read_text().splitlines() == ["0 False"]
    # the activation failed on the compiler, said so, and the variable is back as it was
    # (the message carries the compiler's diagnostics)
    assert proc.stderr.startswith("aicpu-tiling: NPU twin not activated: TwinUnavailableError: "
                                  "the NPU twin needs the AArch64 AI-CPU binary"), proc.stderr
    assert "fake ziglang: no compiler here" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.split() == ["FACTS", "False", "1"]
