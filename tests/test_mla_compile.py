"""The Triton MLA decode kernel and its combine compile for Ascend910B3 up to the step public
wheels cannot take (``tools/ascend_compile.py --mla``, DeepSeek-V3 rank geometry: 16 heads,
kv_lora_rank 512, rope 64), inside the A2's UB. Skips like tests/test_ascend_compile.py when the
Ascend compile venv is missing."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "ascend_compile.py"
VENV = pathlib.Path(os.environ.get(
    "AICPU_TILING_ASCEND_VENV", pathlib.Path.home() / ".cache" / "aicpu-tiling" / "ascend-venv"))


@pytest.mark.skipif(not (VENV / "bin" / "python").exists() and not os.environ.get("CI"),
                    reason=f"no Ascend compile venv at {VENV} (run tools/ascend_compile.py "
                           "once, or set CI=1 to let the test create it)")
def test_mla_kernels_lower_to_hivm_within_the_ub(tmp_path):
    run = subprocess.run([sys.executable, str(TOOL), "--mla", "--venv", str(VENV), "--out",
                          str(tmp_path), "--json"], check=False, capture_output=True, text=True,
                         cwd=ROOT)
    if run.returncode == 2:
        pytest.skip(f"the Ascend toolchain venv cannot be set up here: {run.stderr.strip()}")
    report = json.loads(run.stdout)
    assert report["tiles"] == {"Q_TILE": 4, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_L": 512,
                               "BLOCK_R": 64}
    kinds = {}
    for kernel in report["kernels"]:
        stages = {s["stage"]: s for s in kernel["stages"]}
        bishengir = stages["bishengir"]
        assert bishengir["ok"] or bishengir["stopped_at_hivmc"], bishengir
        assert not bishengir["sync_block_lock_count_function"], kernel["name"]
        assert bishengir["planned_bytes"].get("ub", 0) <= 192 * 1024   # A2's UB per core
        kinds[kernel["name"]] = bishengir["kernel_kind"]
    assert kinds == {"mla_decode_kernel": "MIX (cube + vector)",
                     "attention_combine_kernel[mla]": "AIV (vector only)"}
    assert run.returncode == 0
