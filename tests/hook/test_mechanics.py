"""Hook mechanics: before/after import, idempotence, exact restore, skips and fallback."""

import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hook_fake_engine import RecordingEngine

from pyruntime import hook
from pyruntime.hook import activation, registry
from pyruntime.hook import vllm_ascend_targets as targets
from pyruntime.hook.patching import PatchLedger
from pyruntime.hook.pth import PTH_FILENAME, env_enabled, pth_content, unknown_value_warning

ATTN = "vllm_ascend.attention.attention_v1"
ACL = "vllm_ascend.compilation.acl_graph"
RUNNER = "vllm_ascend.worker.model_runner_v1"
REPO = Path(__file__).resolve().parents[2]


def _engine():
    return RecordingEngine(), None


def _originals():
    attn, acl, runner = (importlib.import_module(n) for n in (ATTN, ACL, RUNNER))
    impl = attn.AscendAttentionBackendImpl
    return {
        "fia": impl.__dict__["full_graph_fia"],
        "update": impl.__dict__["update_graph_params"],
        "forward": impl.__dict__["forward"],
        "acl_update": acl.update_full_graph_params,
        "runner_update": runner.update_full_graph_params,
    }


def _current():
    return _originals()


def _hooked_modules():
    """Every module the patch set hooks (from its own target list) that the fixture has."""
    modules = []
    for name in (targets.ACL_GRAPH, targets.ATTENTION, *targets.IMPORTERS):
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError:
            pass  # an importer of another release line
    return modules


def _snapshot(modules):
    """``{owner: {name: raw value}}`` of each module and of every class defined in it."""
    owners = []
    for module in modules:
        owners.append(module)
        owners += [v for v in vars(module).values()
                   if isinstance(v, type) and v.__module__ == module.__name__]
    return {owner: dict(vars(owner)) for owner in owners}


def _changed(before):
    return {(owner, name) for owner, attrs in before.items()
            for name in attrs.keys() | vars(owner).keys()
            if vars(owner).get(name, _GONE) is not attrs.get(name, _GONE)}


_GONE = object()


def _install_and_uninstall_restore_every_attribute():
    """Install after import, then uninstall: every attribute of every class and module the
    patch set can touch must be the very object it was, and every change install made must
    be one the patch set recorded (so uninstall can undo it)."""
    before = _snapshot(_hooked_modules())
    hook.install(engine_factory=_engine)
    ledger = activation._state.ledger
    recorded = set(ledger.targets())
    assert recorded and {owner for owner, _ in recorded} <= before.keys()
    changed = _changed(before)
    assert changed == recorded, f"patched but not recorded: {changed - recorded}"
    assert hook.uninstall() == len(recorded)
    assert _changed(before) == set(), "not restored by uninstall()"


def test_hook_after_import_patches_and_uninstall_restores_identity(fixture_pkg):
    before = _originals()
    report = hook.install(engine_factory=_engine)
    assert report.state == "active" and report.version == "0.23.0"
    now = _current()
    assert all(now[k] is not before[k] for k in before)
    assert isinstance(now["update"], staticmethod)
    assert now["runner_update"] is now["acl_update"]
    hook.uninstall()
    _install_and_uninstall_restore_every_attribute()


@pytest.mark.parametrize("escaping", ["full_graph_pa", "full_graph_fia_v2",
                                      "update_full_graph_params"])
def test_the_restore_check_catches_a_patch_outside_the_ledger(fixture_pkg, monkeypatch, escaping):
    recording_replace = PatchLedger.replace

    def replace_without_record(self, owner, name, replacement, **kwargs):
        if name == escaping:
            setattr(owner, name, replacement)  # patched, but uninstall() will not know
        else:
            recording_replace(self, owner, name, replacement, **kwargs)

    monkeypatch.setattr(PatchLedger, "replace", replace_without_record)
    with pytest.raises(AssertionError, match=f"patched but not recorded.*'{escaping}'"):
        _install_and_uninstall_restore_every_attribute()


def test_hook_before_import_patches_on_import(fixture_pkg):
    hook.install(engine_factory=_engine)
    assert ATTN not in sys.modules
    runner = importlib.import_module(RUNNER)  # imports acl_graph and attention_v1 too
    acl = sys.modules[ACL]
    assert runner.update_full_graph_params is acl.update_full_graph_params
    assert acl.update_full_graph_params.__wrapped__ is not None
    original = acl.update_full_graph_params.__wrapped__
    assert set(hook.status().patched_modules) >= {ACL, ATTN, RUNNER}
    hook.uninstall()
    assert acl.update_full_graph_params is original
    assert runner.update_full_graph_params is original


def test_double_install_and_double_uninstall_are_no_ops(fixture_pkg):
    before = _originals()
    hook.install(engine_factory=_engine)
    patched = _current()
    hook.install(engine_factory=_engine)
    assert _current() == patched
    assert registry.registered()[ACL] == 1
    hook.uninstall()
    assert hook.uninstall() == 0
    assert _current() == before
    assert registry.registered() == {}


def test_version_mismatch_skips_with_one_log_line(fixture_pkg, tmp_path, monkeypatch, caplog):
    dist = tmp_path / "vllm_ascend-0.31.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-ascend\nVersion: 0.31.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _originals()
    with caplog.at_level(logging.INFO, logger="pyruntime.hook"):
        report = hook.install(engine_factory=_engine)
    assert report.state == "skipped" and "0.31.0 is outside" in report.reason
    assert [r for r in caplog.records if "left untouched" in r.getMessage()].__len__() == 1
    assert _current() == before


def test_kernels_missing_means_nothing_patched(fixture_pkg, monkeypatch):
    monkeypatch.delenv("AICPU_TILING_ENGINE", raising=False)
    monkeypatch.setitem(sys.modules, "pyruntime.tiling", None)  # import now fails
    before = _originals()
    report = hook.install()
    assert report.state == "skipped"
    assert "tiling kernels cannot load" in report.reason
    assert _current() == before


def test_unsupported_device_means_nothing_patched(fixture_pkg, monkeypatch):
    monkeypatch.delenv("AICPU_TILING_ENGINE", raising=False)
    before = _originals()
    report = hook.install()  # no torch_npu here: the device check refuses
    assert report.state == "skipped"
    assert "torch_npu" in report.reason or "cannot load" in report.reason
    assert _current() == before


def test_a_failing_hook_does_not_break_the_import(fixture_pkg, caplog):
    def boom(module):
        raise RuntimeError("boom")

    registry.when_imported(ACL, boom)
    module = importlib.import_module(ACL)
    assert module.update_full_graph_params is not None
    assert "post-import hook for" in caplog.text


def test_ledger_restores_raw_staticmethod_and_leaves_foreign_rebinds():
    class Owner:
        @staticmethod
        def f():
            return 1

    raw = Owner.__dict__["f"]
    ledger = PatchLedger()
    ledger.replace(Owner, "f", staticmethod(lambda: 2))
    assert Owner.f() == 2
    ledger.restore_all()
    assert Owner.__dict__["f"] is raw
    ledger.replace(Owner, "f", staticmethod(lambda: 3))
    foreign = staticmethod(lambda: 4)
    Owner.f = foreign
    assert ledger.restore_all() == 0 and Owner.__dict__["f"] is foreign


def test_env_values():
    assert env_enabled("1") and env_enabled(" On ")
    assert not env_enabled(None) and not env_enabled("0") and not env_enabled("")
    with pytest.raises(hook.ActivationError, match="AICPU_TILING='maybe'"):
        env_enabled("maybe")


def test_pth_content_is_one_import_line():
    text = pth_content()
    assert text.endswith("\n") and text.count("\n") == 1 and text.startswith("import ")
    assert PTH_FILENAME.endswith(".pth")


OURS = "sorted(m for m in sys.modules if m.split('.')[0] in ('pyruntime', 'bindings'))"


def _fresh_interpreter(tmp_path, value, code):
    """Run ``code`` in a new interpreter whose site dir holds our .pth, ``AICPU_TILING=value``."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH_FILENAME).write_text(pth_content())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AICPU_TILING")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "tests" / "fixtures"), str(REPO / "tests" / "hook")]
    )
    env["AICPU_TILING_ENGINE"] = "hook_fake_engine:make_recording"
    if value is not None:
        env["AICPU_TILING"] = value
    code = "import site, sys; site.addsitedir(sys.argv[1]); " + code
    out = subprocess.run([sys.executable, "-c", code, str(site_dir)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.parametrize("value,patched", [("1", True), (" On ", True), ("0", False),
                                           (None, False), ("maybe", False)])
def test_env_activation_in_a_fresh_interpreter(tmp_path, value, patched):
    out = _fresh_interpreter(tmp_path, value, "import vllm_ascend.compilation.acl_graph as m;"
                             "print(hasattr(m.update_full_graph_params, '__wrapped__'))")
    assert out.stdout.strip() == str(patched)


@pytest.mark.parametrize("value", [None, "", "0", "off", "FALSE", "no"])
def test_off_values_import_nothing_of_ours_and_say_nothing(tmp_path, value):
    out = _fresh_interpreter(tmp_path, value, f"print({OURS})")
    assert out.stdout.strip() == "[]" and out.stderr == ""


@pytest.mark.parametrize("value", ["maybe", "2", "enable", "1.0"])
def test_unknown_values_import_nothing_and_print_one_line(tmp_path, value):
    # the .pth runs twice, as site does in a venv made with --system-site-packages
    out = _fresh_interpreter(tmp_path, value, f"site.addsitedir(sys.argv[1]); print({OURS})")
    assert out.stdout.strip() == "[]"
    assert out.stderr.splitlines() == [unknown_value_warning(value)]
    assert f"AICPU_TILING={value!r}" in out.stderr and "1/true/yes/on" in out.stderr


def test_on_value_imports_the_hook(tmp_path):
    out = _fresh_interpreter(tmp_path, "1", f"print({OURS})")
    assert "pyruntime.hook.autostart" in out.stdout and out.stderr == ""
