"""What the vLLM-Ascend op tools (``vllm_ascend_dense_ops.py``, ``vllm_ascend_mla_paths.py``)
set up the way vLLM-Ascend's worker does before a model's forward runs: vLLM's own
``ModelConfig`` of a tiny model and the process groups of one rank.

Why a real ``ModelConfig``: each release reads whichever of its fields it reads (0.30's vLLM
asks ``logits_processors`` when choosing the model runner), so a namespace standing in for it
breaks at every release. Why the process groups: with Triton present vLLM picks its model
runner V2 (``vllm/config/vllm.py`` ``VllmConfig.use_v2_model_runner``: "Model Runner V2
requires Triton"), and vLLM-Ascend 0.30's forward context for V2 reads the TP world size
(``vllm_ascend/platform.py`` ``set_additional_forward_context``).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any


def model_config(name: str, *, max_model_len: int, enforce_eager: bool, **fields: Any):
    """vLLM's ``ModelConfig`` of the tiny model `name` (a key of
    ``pyruntime.hook.dryrun.tiny_models.CONFIGS``) with `fields` replacing its config fields
    (``None`` removes one), read from a ``config.json`` written into a scratch folder (no
    weights: nothing loads them). vLLM inspects the model class in a subprocess (``python -m
    vllm.model_executor.models.registry``), which imports torch_npu as on an NPU: on the twin
    it reaches that process through its ``.pth`` line (``tools/vllm_env.sh`` installs it), so
    ``AICPU_TILING_TWIN`` is turned on here when the twin is active."""
    import transformers
    from vllm.config import ModelConfig

    from pyruntime.hook.dryrun import tiny_models
    from pyruntime.npu_twin import is_active, pth

    if is_active():
        os.environ[pth.ENV_VAR] = "1"
    config_fields = {**tiny_models.CONFIGS[name], **fields}
    config_fields = {k: v for k, v in config_fields.items() if v is not None}
    model_type = config_fields.pop("model_type")
    config_fields.pop("torch_dtype")
    config = transformers.AutoConfig.for_model(model_type, **config_fields)
    with tempfile.TemporaryDirectory() as scratch:
        config.save_pretrained(scratch)
        path = Path(scratch) / "config.json"
        written = json.loads(path.read_text())
        written["torch_dtype"] = tiny_models.DTYPE  # the field vLLM reads on every release
        path.write_text(json.dumps(written))
        return ModelConfig(model=scratch, dtype="bfloat16", skip_tokenizer_init=True,
                           max_model_len=max_model_len, enforce_eager=enforce_eager)


def single_rank_groups(cfg) -> None:
    """vLLM's process groups for one rank (TP 1, PP 1) as vLLM-Ascend's worker makes them
    (``worker/worker.py`` ``NPUWorker._init_worker_distributed_environment``, 0.23.0.post1
    and 0.30.0rc2: backend ``hccl``, then ``init_ascend_model_parallel``)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm_ascend.distributed.parallel_state import init_ascend_model_parallel

    with socket.socket() as probe:  # a free local port for the one-rank rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with set_current_vllm_config(cfg):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "hccl")
        ensure_model_parallel_initialized(1, 1)
        init_ascend_model_parallel(cfg.parallel_config)
