"""The twin's ``plan_tiling`` enforces every ``TORCH_CHECK`` of ``plan_tiling_op.cpp``: the test
reads the C++ and triggers each check on the twin, and the twin's message carries the C++
message's literal text. A check added to the C++ without a twin counterpart fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("unicorn", reason="the twin runs the AI-CPU entry in the AArch64 emulator")
pytest.importorskip("ziglang", reason="the twin's AI-CPU binary is the ziglang AArch64 build")

REPO = Path(__file__).resolve().parents[2]
OP = REPO / "aicpu_kernels" / "npu_ext" / "plan_tiling_op.cpp"

#: C++ checks the twin cannot trigger, with the reason
EXEMPT = {
    "aicpu_tiling: loading the AI-CPU tiling kernel on NPU {static_cast<int>(device)}: ":
        "needs a JSON named without its binary, once per process: "
        "tests/twin/test_devices.py triggers it",
    "plan_tiling: ": "the launcher's own error inside the queued launch: every case it "
                     "reports is refused by an earlier check",
    "npu_load_tiling_kernel: ": "a CANN runtime without aclrtLaunchKernelWithHostArgs, only "
                                "under the twin fault old-cann: tests/twin/test_selfcheck_twin.py "
                                "triggers it and compares the whole line",
}

#: helper-function checks, instantiated per argument name (as PlanTilingNpu calls them)
INT32_ARGS = ("cu_seqlens_q", "seqlens_kv", "batch", "step_epoch")
HELPERS = {"CheckInt32Npu": INT32_ARGS, "CheckTilingBuffer": ("tiling_out",)}


def cpp_checks() -> list[str]:
    """Each TORCH_CHECK's message literals, with `name` substituted in helpers; a runtime
    value between them is written ``{expression}``."""
    text = OP.read_text()
    found = []
    for fn in re.finditer(r"\n(?:void|int) (\w+)\(.*?\n\}", text, re.DOTALL):
        for check in re.finditer(r"TORCH_CHECK\((.*?)\);", fn.group(0), re.DOTALL):
            args = check.group(1)
            # the condition ends at the first top-level comma before the first literal
            literals = re.findall(r'"((?:[^"\\]|\\.)*)"', args)
            tokens = re.split(r'"(?:[^"\\]|\\.)*"', args)[1:-1]  # between literals
            pieces, names = [literals[0]], HELPERS.get(fn.group(1), ("",))
            for between, literal in zip(tokens, literals[1:]):
                gap = between.strip(" ,\n")
                pieces.append(literal if not gap else f"{{{gap}}}{literal}")
            joined = "".join(pieces)
            for name in names:
                found.append(joined.replace("{name}", name) if name else joined)
    return found


def literal_parts(message: str) -> list[str]:
    return [p for p in re.split(r"\{[^}]*\}", message) if p.strip()]


TRIGGERS = '''
import json, torch
from pyruntime import npu_twin
npu_twin.activate()
from pyruntime import tiling
from pyruntime.backends import npu_kernels
from pyruntime.kernels import step
p = tiling.TilingParams(num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                        max_batch=4, max_tokens=8, max_blocks_per_req=4, num_cores=4)
good = dict(cu_seqlens_q=torch.zeros(5, dtype=torch.int32, device="npu"),
            seqlens_kv=torch.zeros(4, dtype=torch.int32, device="npu"),
            batch=torch.zeros(1, dtype=torch.int32, device="npu"),
            step_epoch=torch.zeros(1, dtype=torch.int32, device="npu"),
            tiling_out=torch.zeros(p.tiling_bytes, dtype=torch.uint8, device="npu"),
            params=step.params_list(p), causal=True)
out = {}
def attempt(key, **changes):
    try:
        torch.ops.aicpu_tiling.plan_tiling(**{**good, **changes})
        out[key] = "accepted"
    except RuntimeError as exc:
        out[key] = str(exc)
from pyruntime.npu_twin import extension
extension.register()
attempt("not loaded")
try:
    torch.ops.aicpu_tiling.npu_load_tiling_kernel("/nonexistent/libaicpu_tiling_runtime.json")
except RuntimeError as exc:
    out["load"] = str(exc)
npu_kernels.load()
try:
    torch.ops.aicpu_tiling.npu_load_tiling_kernel("/elsewhere/libaicpu_tiling_runtime.json")
except RuntimeError as exc:
    out["load again"] = str(exc)
attempt("same npu", tiling_out=torch.zeros(p.tiling_bytes, dtype=torch.uint8, device="npu:1"))
for name in ("cu_seqlens_q", "seqlens_kv", "batch", "step_epoch", "tiling_out"):
    t = good[name]
    attempt(f"{name} device", **{name: torch.zeros(t.shape, dtype=t.dtype)})
    cols = {"cu_seqlens_q": 3, "tiling_out": p.tiling_bytes}.get(name, 2)  # enough values
    attempt(f"{name} contiguous", **{name: torch.zeros(cols, 2, dtype=t.dtype,
                                                       device="npu").t()})
    attempt(f"{name} size", **{name: torch.zeros(0, dtype=t.dtype, device="npu")})
    if name != "tiling_out":
        attempt(f"{name} dtype", **{name: torch.zeros(t.shape, dtype=torch.int64,
                                                      device="npu")})
attempt("params count", params=step.params_list(p)[:5])
def attempt_many(key, outs, params):  # the array form: one launch, several tilings
    kwargs = {k: v for k, v in good.items() if k not in ("tiling_out", "params")}
    try:
        torch.ops.aicpu_tiling.plan_tilings(**kwargs, tiling_outs=outs, params=params)
        out[key] = "accepted"
    except RuntimeError as exc:
        out[key] = str(exc)
buf = good["tiling_out"]
attempt_many("plans none", [], [])
attempt_many("plans too many", [buf] * 5, step.params_list(p) * 5)
attempt_many("plans params", [buf, buf.clone()], step.params_list(p))
windowed = step.params_list(p)[:-1] + [64]  # sliding_window is the last field
attempt_many("plans valid", [buf, buf.clone()], step.params_list(p) + windowed)
attempt_many("plans small", [buf, buf[:8]], step.params_list(p) + windowed)

attempt("params int32", params=[2**40] + step.params_list(p)[1:])
attempt("params invalid", params=[0] + step.params_list(p)[1:])
attempt("argument block", seqlens_kv=torch.zeros(5, dtype=torch.int32, device="npu"),
        cu_seqlens_q=torch.zeros(6, dtype=torch.int32, device="npu"))
attempt("valid")
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def twin_messages(tmp_path_factory) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "AICPU_TILING_TWIN_STATE": str(tmp_path_factory.mktemp("twin"))}
    proc = subprocess.run([sys.executable, "-c", TRIGGERS], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_parser_finds_every_check():
    checks = cpp_checks()
    # CheckInt32Npu: 4 per int32 argument; CheckTilingBuffer: 3; the loader: 3 (another path,
    # unreadable, no host-args launch in the CANN runtime); EnsureLoaded: 1; ReadParams: 2;
    # PlanTilings: 6 (the plan count, the params count, same device, the argument block,
    # loaded, the launcher's own)
    assert len(checks) == 4 * len(INT32_ARGS) + 3 + 3 + 1 + 2 + 6, checks
    assert "plan_tiling: tiling_out must be contiguous" in checks


@pytest.mark.parametrize("check", cpp_checks())
def test_each_cpp_check_has_a_twin_counterpart(check, twin_messages):
    if check in EXEMPT:
        pytest.skip(EXEMPT[check])
    parts = literal_parts(check)
    matching = [m for m in twin_messages.values()
                if all(part in m for part in parts)]
    assert matching, f"no twin check says {parts}; the twin said {twin_messages}"


def test_a_valid_call_is_accepted(twin_messages):
    assert twin_messages["valid"] == "accepted"
    assert "before capturing" in twin_messages["not loaded"]


def test_the_array_form_checks_each_tiling(twin_messages):
    """plan_tilings: 1 to AICPU_TILING_KERNEL_MAX_PLANS tilings, 13 params each, each buffer
    sized for its own params; two tilings (a full and a windowed one) in one launch pass."""
    assert twin_messages["plans valid"] == "accepted"
    assert "0 tiling buffers, one launch plans 1 to 4" in twin_messages["plans none"]
    assert "5 tiling buffers, one launch plans 1 to 4" in twin_messages["plans too many"]
    assert "expected 13 per tiling buffer" in twin_messages["plans params"]
    assert "tiling_out holds 8 bytes" in twin_messages["plans small"]
