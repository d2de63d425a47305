"""Several devices on the NPU twin (issue 28 item 2) and the AI-CPU launcher per device
(review 2 item 1, issue 29).

The rules (sources in `pyruntime.npu_twin.device`'s docstring): ``$AICPU_TILING_TWIN_DEVICES``
devices (default 2), a current device per thread, streams / graphs / events / memory bound
to a device, CANN's 107001 for a device it does not have, CANN's 107003 for a runtime call on
a stream outside the current context, torch_npu's text for an event recorded on a second
device. Each case runs in a twin subprocess (`test_preflight.run_case`).
"""

from __future__ import annotations

import pytest

from tests.twin.test_preflight import REPO, run_case

#: vLLM-Ascend's order in a TP >= 2 worker: its worker module imports the modules our hook
#: patches, so the hook loads our kernels (npu_kernels.load) before the worker's _init_device
#: calls torch.npu.set_device(local_rank) (vllm-ascend 0.30.0rc2 worker/worker.py:108, :433);
#: then vLLM captures and replays on that device
WORKER_ON_DEVICE_1 = '''
from pyruntime.attention import StaticAttention
from pyruntime.backends import npu_kernels
from pyruntime.backends.npu import NpuBackend
from pyruntime.npu_twin import extension
from pyruntime.selfcheck.attention_checks import NUM_BLOCKS, SHAPES, _batcher
from pyruntime.selfcheck.context import Context
from pyruntime.workload.driver import randomize, run_decode_loop
npu_kernels.load()
torch.npu.set_device(1)
be = NpuBackend(device=1)
attn = StaticAttention(be, num_layers=2, num_blocks=NUM_BLOCKS, mode="device_tiling",
                       placement="graph", dtype=torch.float32, num_cores=4, **SHAPES)
randomize(attn)
attn.capture()
stats = run_decode_loop(attn, _batcher(Context("npu", None)), steps=3)
assert stats.max_rel_err < 1e-4, stats.max_rel_err
result = {"launchers": sorted(extension._launchers), "err": float(stats.max_rel_err)}
'''

#: the extension before the fix: one launcher, loaded by npu_load_tiling_kernel on the
#: current device after npu_kernels.load set it (device 0 at the hook's import time)
ONE_LAUNCHER_ON_DEVICE_0 = '''
from pyruntime.npu_twin import extension
from pyruntime.backends import npu_kernels
extension.LAUNCHER_PER_DEVICE = False
'''


def test_a_worker_on_device_1_captures_and_replays_there(tmp_path):
    """Review 2 item 1: the hook loads our kernels before the worker sets device 1; the
    capture and every replay on device 1 plan their tilings with a launcher of device 1."""
    got = run_case(WORKER_ON_DEVICE_1, tmp_path=tmp_path, timeout=400)
    assert got.get("ok", {}).get("launchers") == [1], got


def test_the_old_single_launcher_on_device_0_fails_as_the_runtime_would(tmp_path):
    """The same worker with the extension as it was (one launcher made on device 0 at load):
    the launch waits on the device-0 AI-CPU stream from device 1's context, which CANN
    refuses with ACL_ERROR_RT_STREAM_CONTEXT (107003, EE1010)."""
    got = run_case(WORKER_ON_DEVICE_1, mutation=ONE_LAUNCHER_ON_DEVICE_0, tmp_path=tmp_path,
                   timeout=400)
    assert "error" in got, got
    assert "107003" in got["error"] and "does not belong to the current context" in \
        got["error"], got


def test_without_the_device_guard_the_launch_runs_in_the_wrong_context(tmp_path):
    """plan_tiling_op.cpp's NPUGuard on the tensors' device is what makes the launch's runtime
    calls legal when the thread's current device is another one."""
    body = '''
    from pyruntime import tiling
    from pyruntime.backends import npu_kernels
    from pyruntime.kernels import step
    npu_kernels.load()
    p = tiling.TilingParams(num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                            max_batch=4, max_tokens=8, max_blocks_per_req=4, num_cores=4)
    i32 = dict(dtype=torch.int32, device="npu:1")
    args = dict(cu_seqlens_q=torch.zeros(5, **i32), seqlens_kv=torch.zeros(4, **i32),
                batch=torch.zeros(1, **i32), step_epoch=torch.zeros(1, **i32),
                tiling_out=torch.zeros(p.tiling_bytes, dtype=torch.uint8, device="npu:1"),
                params=step.params_list(p), causal=True)
    torch.zeros(1, device="npu:0")  # device 0's context exists too
    before = torch.npu.current_device()  # 0: the tensors are on device 1
    torch.ops.aicpu_tiling.plan_tiling(**args)
    torch.npu.synchronize(1)
    result = [before, torch.npu.current_device()]
    '''
    assert run_case(body, tmp_path=tmp_path) == {"ok": [0, 0]}
    no_guard = '''
    from pyruntime.npu_twin import extension
    extension.HOLDS_DEVICE_GUARD = False
    '''
    got = run_case(body, mutation=no_guard, tmp_path=tmp_path)
    assert "107003" in got.get("error", ""), got
    source = REPO / "aicpu_kernels/npu_ext/plan_tiling_op.cpp"
    assert "c10_npu::NPUGuard device_guard(device);" in source.read_text()


def test_a_json_without_its_binary_fails_at_the_first_launch_naming_the_device(tmp_path):
    """The lazy load's own error (the EXEMPT entry of test_extension_checks): naming a JSON is
    accepted, loading it on a device at the first launch there fails and names the device."""
    body = '''
    import json, os
    from pathlib import Path
    from pyruntime.kernels import custom_ops
    from pyruntime.npu_twin import extension
    custom_ops.ops()
    torch.ops.load_library(os.environ["AICPU_TILING_NPU_EXT"])
    lonely = Path("lonely") / "libaicpu_tiling_runtime.json"
    lonely.parent.mkdir()
    lonely.write_text(json.dumps({"AicpuTilingKernel": {"opInfo": {}}}))
    torch.ops.aicpu_tiling.npu_load_tiling_kernel(str(lonely))
    torch.ops.aicpu_tiling.npu_load_tiling_kernel(str(lonely), 1)
    result = "loaded"
    '''
    got = run_case(body, tmp_path=tmp_path)
    assert got["error"].startswith("RuntimeError: aicpu_tiling: loading the AI-CPU tiling "
                                   "kernel on NPU 1: "), got
    assert "CPU kernel mode 1 loads libaicpu_tiling_runtime.so" in got["error"]


DEVICE_API = '''
from pyruntime.npu_twin import device as twin
import threading
out = {}
out["count"] = torch.npu.device_count()
out["current"] = torch.npu.current_device()
try:
    torch.npu.set_device(torch.npu.device_count())
except twin.AclError as exc:
    out["invalid"] = [exc.code, str(exc)]
a = torch.ones(3, device="npu")
torch.npu.set_device(1)
b = torch.ones(3, device="npu")
c = torch.ones(3, device="npu:0")
out["devices"] = [str(a.device), str(b.device), str(c.device), str((b + 1).device)]
try:
    a + b
except RuntimeError as exc:
    out["mixed"] = str(exc)
s1 = torch.npu.Stream()
s0 = torch.npu.Stream(device=0)
out["streams"] = [str(s1.device), str(s0.device), str(torch.npu.current_stream(0).device)]
with torch.npu.stream(s0):  # StreamContext: the stream's device becomes current inside
    out["in_stream_ctx"] = [torch.npu.current_device(), torch.npu.current_stream() == s0]
out["after_stream_ctx"] = [torch.npu.current_device(), torch.npu.current_stream(0) == s0]
with torch.npu.device(0):
    out["in_device_ctx"] = torch.npu.current_device()
out["after_device_ctx"] = torch.npu.current_device()
seen = []
worker = threading.Thread(target=lambda: seen.append(torch.npu.current_device()))
worker.start(); worker.join()
out["other_thread"] = seen[0]  # the current device is per thread
# a graph captured on device 1 replays there, on device 1's memory
g, acc = torch.npu.NPUGraph(), torch.zeros(2, device="npu")
torch.npu.synchronize()
with torch.npu.graph(g, stream=s1):
    acc.add_(1)
torch.npu.set_device(0)
g.replay(); g.replay(); g.replay()
out["replayed_on_device_1"] = [acc.cpu().tolist(), str(acc.device)]
# torch_npu's Event takes the device of its first recording stream
e = torch.npu.Event()
e.record(s0)
try:
    e.record(s1)
except RuntimeError as exc:
    out["event_other_device"] = str(exc)
s1.wait_event(e)  # a wait from another device's stream: a remote wait, allowed
torch.npu.synchronize(1)
# a raw runtime call on a stream of another device than the current one
try:
    twin.device().check_stream_context(s1.state, "Event recording")
except twin.AclError as exc:
    out["raw_other_context"] = exc.code
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def device_api(tmp_path_factory):
    import json
    import os
    import subprocess
    import sys

    def run(env_devices: str | None) -> dict:
        env = {**os.environ, "PYTHONPATH": str(REPO),
               "AICPU_TILING_TWIN_STATE": str(tmp_path_factory.mktemp("twin"))}
        env.pop("AICPU_TILING_TWIN_DEVICES", None)
        if env_devices is not None:
            env["AICPU_TILING_TWIN_DEVICES"] = env_devices
        script = "import json\nfrom pyruntime import npu_twin\nnpu_twin.activate()\n" \
                 "import torch\n" + DEVICE_API
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=300, env=env, check=False)
        if proc.returncode != 0:
            return {"crashed": proc.stderr[-3000:]}
        return json.loads(proc.stdout.splitlines()[-1])
    return run


def test_two_devices_by_default_each_with_its_streams_memory_and_graphs(device_api):
    got = device_api(None)
    assert got["count"] == 2 and got["current"] == 0, got
    assert got["invalid"][0] == 107001 and "invalid device id" in got["invalid"][1]
    assert got["devices"] == ["npu:0", "npu:1", "npu:0", "npu:1"]
    assert "Expected all tensors to be on the same device, but found at least two " \
           "devices, npu:0 and npu:1!" in got["mixed"]
    assert got["streams"] == ["npu:1", "npu:0", "npu:0"]
    assert got["in_stream_ctx"] == [0, True] and got["after_stream_ctx"] == [1, False]
    assert got["in_device_ctx"] == 0 and got["after_device_ctx"] == 1
    assert got["other_thread"] == 0
    assert got["replayed_on_device_1"] == [[3.0, 3.0], "npu:1"]


def test_an_event_of_device_0_used_on_device_1_raises_what_the_stack_raises(device_api):
    """torch_npu's NPUEvent: recording on a second device's stream is refused with its text;
    a raw runtime call on another context's stream is CANN's 107003."""
    got = device_api(None)
    assert got["event_other_device"] == \
        "Event device 0 does not match recording stream's device 1."
    assert got["raw_other_context"] == 107003


def test_the_device_count_comes_from_the_environment(device_api):
    assert device_api("3")["count"] == 3
    assert "must be a whole number from 1 to 64, got 'zero'" in device_api("zero")["crashed"]
