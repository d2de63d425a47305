"""The NPU twin in the processes vLLM starts (issue 28, item 3), in the vLLM environments of
``tools/vllm_env.sh`` (0.23.0.post1 with vLLM 0.23, 0.30.0rc2 with vLLM 0.30), which install
the twin's ``.pth`` into their venv on every call.

With ``AICPU_TILING_TWIN=1`` and ``VLLM_ENABLE_V1_MULTIPROCESSING=1``, a process of that venv
with this checkout on ``PYTHONPATH`` starts children the way vLLM does, and each reports
that ``torch.npu`` is the twin and that a device round trip works there:

* the model-inspection subprocess: vLLM's own ``_run_in_subprocess``
  (``vllm/model_executor/models/registry.py``), which runs ``python -m
  vllm.model_executor.models.registry`` with a cloudpickled function on stdin, after
  ``load_general_plugins()``;
* children of vLLM's ``get_mp_context()`` (``vllm/utils/system_utils.py``: the context of the
  engine core and of every worker) with ``VLLM_WORKER_MULTIPROC_METHOD`` ``spawn`` and ``fork``.

vLLM-Ascend's tree is left off ``PYTHONPATH``: its general plugins would run in the
inspection child and they import ``torch.distributed.is_hccl_available``, which the twin does
not have yet (issue 28, item 2). Without the environment, or with its ``.pth`` missing or
outdated, the test skips (under ``CI=true`` it fails).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pyruntime.npu_twin import pth
from tests.wheels import vllm_env, wheels_required

REPO = Path(__file__).resolve().parents[2]
PROBE_DIR = Path(__file__).resolve().parent
#: the oldest and the newest supported release (tests/hook/test_in_vllm_ascend.py)
RELEASES = ("0.23.0.post1", "0.30.0rc2")

SCRIPT = r'''
import json, os
from twin_processes_probe import facts_from_a_child, facts_using_the_device, twin_facts
from vllm.model_executor.models.registry import _run_in_subprocess
from vllm.utils.system_utils import get_mp_context

out = {"parent": twin_facts()}
out["model_inspection"] = _run_in_subprocess(facts_using_the_device)
for method in ("spawn", "fork"):
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = method
    context = get_mp_context()
    out[method] = dict(facts_from_a_child(context), start_method=context.get_start_method())
print("FACTS " + json.dumps(out))
'''


def _venv_with_the_pth(release: str) -> Path:
    python = vllm_env(release) / "venv" / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_dir = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              timeout=120, check=True)
    if not pth.installed(Path(site_dir.stdout.strip())):
        message = (f"the NPU twin's {pth.PTH_FILENAME} is missing or outdated in the vLLM "
                   f"{release} venv (run tools/vllm_env.sh {release}: it installs it)")
        if wheels_required():
            pytest.fail(f"{message}; CI=true requires it")
        pytest.skip(message)
    return python


@pytest.mark.parametrize("release", RELEASES)
def test_model_inspection_and_vllms_multiprocessing_children_have_the_twin(release):
    python = _venv_with_the_pth(release)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AICPU_TILING", "VLLM_")) and k != "PYTHONHOME"}
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO), str(PROBE_DIR)]),
                pth.ENV_VAR: "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    proc = subprocess.run([str(python), "-c", SCRIPT], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aicpu-tiling:" not in proc.stderr, proc.stderr
    facts = json.loads(proc.stdout.split("FACTS ")[-1])
    assert facts["parent"]["active"] and facts["parent"]["torch_npu_is_twin"], facts
    pids = {facts["parent"]["pid"]}
    for name, method in (("model_inspection", None), ("spawn", "spawn"), ("fork", "fork")):
        child = facts[name]
        assert child.get("active") is True, (name, child)
        assert child["torch_npu_is_twin"] and child["torch_npu_module"] == \
            "pyruntime.npu_twin.npu_module", (name, child)
        assert child["device_sum"] == 6.0, (name, child)
        assert method is None or child["start_method"] == method
        pids.add(child["pid"])
    assert len(pids) == 4  # four processes
