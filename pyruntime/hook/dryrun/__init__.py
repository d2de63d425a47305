"""The dry runs: vLLM-Ascend's own classes driven without and with the hook, on the NPU twin
where no NPU is present (``aicpu-tiling hook-dryrun``). A test harness for the hook, not a
part of it: nothing in the hook imports this package.

* `driver`: the one capture/replay loop (`driver.run`), the child process that runs it
  (``python -m pyruntime.hook.dryrun``), and the report (`driver.report`).
* `models`: the layer sets of ``--model``, as data (`models.MODELS`).
* `gqa`, `mla`: what differs per geometry (vLLM-Ascend's GQA attention or its ``AscendMLAImpl``):
  how the layers and metadata are built, checked and described.
* `kv_caches`: the GQA layers' KV caches, allocated as the release's model runner allocates
  them (on 0.30 the full-attention and C8 layers' K and V pages side by side).

Beside the dry run, the engine check of ``aicpu-tiling serve-check`` (vLLM's whole engine,
without and with the hook), each imported where it is used:

* `engine_check`: the two engine runs (a child process each), the counters, the report.
* `judge`: the tokens of the two runs against an fp32 reference, with a dtype tolerance.
* `tiny_models`: the tiny random models (and LoRA adapter) the check writes itself.

The names below are the driver's and the models' (no vLLM or torch import until a run).
"""

from __future__ import annotations

from .driver import (
    REPO,
    REPORT_FIELDS,
    SCHEMA,
    Run,
    check_real_vllm_ascend,
    dry_run,
    report,
    run,
    run_in_child,
    start_device,
)
from .models import MODELS, TOLERANCE, TOLERANCES, DryRunError, MLAShape, Shape, shape_of

__all__ = [
    "MODELS",
    "REPO",
    "REPORT_FIELDS",
    "SCHEMA",
    "TOLERANCE",
    "TOLERANCES",
    "DryRunError",
    "MLAShape",
    "Run",
    "Shape",
    "check_real_vllm_ascend",
    "dry_run",
    "report",
    "run",
    "run_in_child",
    "shape_of",
    "start_device",
]
