"""The NPU-only modules run, line for line, on the twin: `tools/twin_coverage.py` drives the
NPU backend, the kernel loader and the vLLM engine through every selfcheck check and the
engine's capture/replay, and reports their line coverage (issue 16 aims at 90 %)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("coverage")
pytest.importorskip("unicorn", reason="the twin runs the AI-CPU entry in the AArch64 emulator")
pytest.importorskip("triton", reason="the twin's AI Core runs the Triton kernels interpreted")

REPO = Path(__file__).resolve().parents[2]
#: per file: a drop below this means an NPU-only path lost its twin run
FLOOR = 85.0


def test_npu_modules_run_on_the_twin(tmp_path, capsys):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AICPU_TILING_TWIN_STATE": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "twin_coverage.py"), "--json"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
                          check=False)
    report = json.loads(proc.stdout.splitlines()[-1])
    failed = {k: v for k, v in report["scenarios"].items() if v != "ok"}
    assert not failed and proc.returncode == 0, failed or proc.stderr
    with capsys.disabled():
        print("\n" + ", ".join(f"{Path(p).name} {f['percent']} %"
                               for p, f in report["files"].items())
              + f"; total {report['total_percent']} % (tools/twin_coverage.py)")
    low = {p: f["percent"] for p, f in report["files"].items() if f["percent"] < FLOOR}
    assert not low, f"line coverage on the twin fell below {FLOOR} %: {low}"
