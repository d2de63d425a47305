"""The pre-flight review's findings (issue 16; summarised in docs/npu-twin.md), each
run on the NPU twin: the fixed code passes, and a mutation that restores the old behaviour
fails the way the review predicted for real hardware.

Every case runs in its own subprocess (the twin is once per process). A case is a script
that prints one JSON line: ``{"ok": value}`` or ``{"error": "<Type>: <message>"}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("unicorn", reason="the twin runs the AI-CPU entry in the AArch64 emulator")
pytest.importorskip("ziglang", reason="the twin's AI-CPU binary is the ziglang AArch64 build")

REPO = Path(__file__).resolve().parents[2]

#: what every case may use: a small StaticAttention on the NPU backend, stepped and checked
#: against the float64 reference on trace batches
PRELUDE = '''
import json, sys, traceback
from pyruntime import npu_twin
npu_twin.activate(FAULT)
import numpy as np, torch
from pyruntime import backends

def scenario(mode="device_tiling", placement="graph", steps=4, dtype=torch.float32):
    from pyruntime.attention import StaticAttention
    from pyruntime.selfcheck.attention_checks import NUM_BLOCKS, SHAPES, _batcher
    from pyruntime.selfcheck.context import Context
    from pyruntime.workload.driver import randomize, run_decode_loop
    be = backends.get("npu")
    attn = StaticAttention(be, num_layers=2, num_blocks=NUM_BLOCKS, mode=mode,
                           placement=placement, dtype=dtype, num_cores=4, **SHAPES)
    randomize(attn)
    attn.capture()
    stats = run_decode_loop(attn, _batcher(Context("npu", None)), steps=steps)
    assert stats.max_rel_err < 1e-4, stats.max_rel_err
    return round(float(stats.max_rel_err), 9)
'''


def run_case(body: str, *, mutation: str = "", fault: str | None = None,
             tmp_path: Path, timeout: float = 180) -> dict:
    """Run PRELUDE, `mutation` (old behaviour restored), then `body` (which sets
    ``result``) on the twin; returns the JSON it printed."""
    script = "\n".join([
        f"FAULT = {fault!r}", PRELUDE, textwrap.dedent(mutation),
        "try:", textwrap.indent(textwrap.dedent(body), "    "),
        "    print(json.dumps({'ok': result}))",
        "except Exception as exc:",
        "    print(json.dumps({'error': f'{type(exc).__name__}: {exc}'}))",
    ])
    env = {**os.environ, "AICPU_TILING_TWIN_STATE": str(tmp_path / "twin"),
           "AICPU_TILING_TWIN_AICORE": "reference", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"the case crashed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])


def test_item2_binary_names_agree_and_the_old_name_is_refused(tmp_path):
    """CPU kernel mode 1 loads <json stem>.so: the shipped JSON loads; the old name fails."""
    body = '''
    from pyruntime.backends import npu_kernels
    files = npu_kernels.load(device=0)  # the binary now, as the self-check loads it
    result = files.runtime_json.name
    '''
    assert run_case(body, tmp_path=tmp_path) == {"ok": "libaicpu_tiling_runtime.json"}
    old = '''
    import shutil, os
    from pathlib import Path
    from pyruntime.backends import npu_kernels
    kernels = Path(os.environ["AICPU_TILING_KERNEL_DIR"])
    shutil.copy(kernels / "libaicpu_tiling_runtime.json", kernels / "aicpu_tiling_runtime.json")
    npu_kernels.RUNTIME_JSON = "aicpu_tiling_runtime.json"   # the name before the fix
    npu_kernels.find = lambda: npu_kernels.KernelFiles(
        Path(os.environ["AICPU_TILING_NPU_EXT"]), kernels / "aicpu_tiling_runtime.json")
    '''
    got = run_case(body, mutation=old, tmp_path=tmp_path)
    assert "CPU kernel mode 1 loads aicpu_tiling_runtime.so" in got["error"]


def test_item3_the_tiling_buffer_is_bytes_and_every_launch_is_accepted(tmp_path):
    """Every caller allocates the tiling as uint8; the op used to demand int32."""
    body = '''
    from pyruntime.selfcheck.device_checks import TilingTask, probe_params
    from pyruntime.backends import npu_kernels
    npu_kernels.load()
    be = backends.get("npu")
    task = TilingTask(be, probe_params(20))
    task.stage(np.arange(3, dtype=np.int32), np.array([5, 900], np.int32), epoch=3)
    task.launch()
    header = task.read().view(np.int32)
    result = [str(task.tiling.dtype), int(header[0] != 0), int(header[8])]
    '''
    ok = run_case(body, tmp_path=tmp_path)["ok"]
    assert ok[0] == "torch.uint8" and ok[1] == 1
    old = '''
    from pyruntime.npu_twin import extension
    checked = extension._check_npu
    def int32_only(t, name):
        checked(t, name)
        if name == "tiling_out" and t.dtype != torch.int32:
            raise RuntimeError(f"plan_tiling: tiling_out must be int32, got {t.dtype}")
    extension._check_npu = int32_only
    '''
    assert "tiling_out must be int32" in run_case(body, mutation=old, tmp_path=tmp_path)["error"]


def test_item4_an_exception_in_capture_leaves_no_capturing_stream(tmp_path):
    """The abort path ends the native capture: later syncs and captures work."""
    body = '''
    be = backends.get("npu")
    stream, x = be.stream(), be.alloc([4], torch.float32)
    try:
        with be.capture(be.graph(), stream):
            torch.ops.aten.fill_(x, 1.0)
            raise KeyError("boom")
    except KeyError:
        pass
    be.synchronize()                       # refused while anything still captures
    g = be.graph()
    with be.capture(g, stream):            # the same stream captures again
        torch.ops.aten.fill_(x, 2.0)
        from pyruntime.backends import Kernel
        be.launch(Kernel("noop", "aicore", lambda core, **a: None,
                         npu_op=lambda **a: torch.ops.aten.add_(a["x"], 1.0)),
                  {"x": x}, num_cores=1, stream=stream)
    g.replay(stream)
    stream.synchronize()
    result = x.cpu().tolist()
    '''
    assert run_case(body, tmp_path=tmp_path) == {"ok": [3.0, 3.0, 3.0, 3.0]}
    old = '''
    from pyruntime.backends.npu import NpuBackend
    NpuBackend._end_native_capture = lambda self, graph: None
    '''
    got = run_case(body, mutation=old, tmp_path=tmp_path)
    assert "CaptureViolation" in got["error"]


def test_item5_attention_checks_read_device_tensors_through_the_host(tmp_path):
    """check() and the float64 reference read device tensors with .cpu(), not .numpy()."""
    assert run_case("result = scenario()", tmp_path=tmp_path)["ok"] < 1e-4
    old = '''
    from pyruntime import tiling
    from pyruntime.kernels import step
    step.tiling_status = lambda params, buf: tiling.Tiling(
        params, buf.numpy().view(np.uint8), step._NO_LENGTHS, step._NO_LENGTHS, True)
    from pyruntime.graph_attention import device_tiling
    device_tiling.kernels = step
    '''
    got = run_case("result = scenario()", mutation=old, tmp_path=tmp_path)
    assert "TypeError: can't convert npu:0 device type tensor to numpy" in got["error"]


def test_item6_the_host_update_baseline_hands_no_host_array_to_the_ai_core(tmp_path):
    """On the NPU, host_update runs FIA with host lists; our kernel with host arrays faults."""
    body = '''
    result = scenario(mode="host_update", placement=None)
    '''
    assert run_case(body, tmp_path=tmp_path)["ok"] < 1e-4
    old = '''
    from pyruntime.backends.npu import NpuBackend
    NpuBackend.host_update_attention = "emulated"
    '''
    got = run_case(body, mutation=old, tmp_path=tmp_path)
    assert got["error"].startswith("BackendError") and "HostPointerError" in got["error"]


def test_item7_the_binary_loads_with_a_device_context(tmp_path):
    """torch_npu sets the device lazily: the loader needs a context. The extension loads each
    device's launcher under an NPUGuard on that device (review 2 item 1 moved the load from
    npu_kernels.load's set_device to there); without the guard, CANN 107002."""
    body = '''
    from pyruntime.backends import npu_kernels
    result = str(npu_kernels.load(device=0).runtime_json.name)
    '''
    assert "ok" in run_case(body, tmp_path=tmp_path)
    no_guard = '''
    from pyruntime.npu_twin import extension
    extension.HOLDS_DEVICE_GUARD = False
    '''
    got = run_case(body, mutation=no_guard, tmp_path=tmp_path)
    assert "107002" in got["error"]
    source = (REPO / "aicpu_kernels/npu_ext/plan_tiling_op.cpp").read_text()
    assert "c10_npu::NPUGuard" in source  # what HOLDS_DEVICE_GUARD = True models


def test_item8_task_queue_level_2_refuses_capture(tmp_path):
    body = '''
    be = backends.get("npu")
    g = be.graph()
    with be.capture(g, be.stream()):
        pass
    result = "captured"
    '''
    got = run_case(body, mutation="import os; os.environ['TASK_QUEUE_ENABLE'] = '2'",
                   tmp_path=tmp_path)
    assert "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture" in got["error"]


def test_item9_step_copies_never_read_freed_host_memory(tmp_path):
    """copy_h2d stages a temporary; a non_blocking copy of it runs after it is freed."""
    assert run_case("result = scenario(placement='pre-replay')", tmp_path=tmp_path)["ok"] < 1e-4
    old = '''
    from pyruntime.backends.npu import NpuBackend
    def racy(self, stream, dst, src):
        with self.npu.stream(stream.native):
            dst.copy_(src, non_blocking=True)
    NpuBackend._copy_h2d = racy
    '''
    got = run_case("result = scenario(placement='pre-replay')", mutation=old, tmp_path=tmp_path)
    assert "PageableCopyRace" in got["error"]


@pytest.mark.parametrize("placement", ["graph", "pre-replay"])
def test_item11_engine_epoch_is_advanced_on_the_device_with_no_host_copy(tmp_path, placement):
    """Item 11 was a race on the engine's pageable host epoch, copied to every key before
    each replay; since issue 30 there is no host epoch: the engine advances one device epoch
    in place (AI Core ops captured once per graph: an add under ``graph``; under
    ``pre-replay`` the plan epoch published as the step epoch, then advanced), which the twin
    runs in stream order with no host-to-device copy and no host wait, and which wraps in
    int32 from whatever the fresh memory held."""
    body = f'''
    from pyruntime.hook.npu_engine import NpuTilingEngine
    from pyruntime.npu_twin import device as twin
    engine = NpuTilingEngine({placement!r}, num_cores=4, ops=object())
    epoch = engine._epoch_buffer(torch.device("npu", 0))
    advance = engine._advance_epoch if engine.placement == "graph" else engine._publish_epoch
    stats = twin.device().stats
    waits = ("copies_h2d_blocking", "copies_d2h", "synchronizes")
    before = [stats[k] for k in waits]
    for _ in range(3):
        advance()
    during = [stats[k] - b for k, b in zip(waits, before)]
    first = twin.inner(epoch).clone()  # what the device holds now: nothing has run yet
    torch.npu.synchronize()
    plan = None if engine._plan_epoch is None else int(engine._plan_epoch.cpu()[0])
    result = {{"waits": during, "unrun": int(first[0]), "advanced": engine.device_epoch(),
               "plan": plan}}
    '''
    got = run_case(body, tmp_path=tmp_path)["ok"]
    poison = int.from_bytes(bytes([0xA5] * 4), "little", signed=True)
    if placement == "graph":
        assert got == {"waits": [0, 0, 0], "unrun": poison, "advanced": poison + 3,
                       "plan": None}
    else:  # the step epoch is the plan epoch of the last replay, one behind the next's
        assert got == {"waits": [0, 0, 0], "unrun": poison, "advanced": poison + 2,
                       "plan": poison + 3}


def test_found_by_the_twin_plan_tiling_needs_the_extension_before_capture(tmp_path):
    """Not in the review: without the extension, plan_tiling's composite CPU body would run
    on device tensors (its `.item()` inside the capture); kernels now load before capture."""
    assert run_case("result = scenario()", tmp_path=tmp_path)["ok"] < 1e-4
    old = '''
    from pyruntime.backends.npu import NpuBackend
    NpuBackend.prepare_kernels = lambda self: None
    '''
    got = run_case("result = scenario()", mutation=old, tmp_path=tmp_path)
    assert "has no NPU (PrivateUse1) kernel" in got["error"]


def test_item11_build_paths_leave_site_packages_alone(monkeypatch, tmp_path):
    """After a regular install the build root is the user cache and building says it needs a
    source checkout (no twin needed)."""
    from pyruntime.backends import npu_kernels

    monkeypatch.setattr(npu_kernels, "CHECKOUT", tmp_path / "site-packages")
    monkeypatch.delenv(npu_kernels.BUILD_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert npu_kernels.source_checkout() is None
    assert npu_kernels.build_root() == tmp_path / "cache" / "aicpu-tiling" / "build" / "aicpu"
    with pytest.raises(npu_kernels.KernelsUnavailableError, match="source checkout"):
        npu_kernels.build()
    monkeypatch.setattr(npu_kernels, "CHECKOUT", REPO)
    assert npu_kernels.build_root() == REPO / "build" / "aicpu"
