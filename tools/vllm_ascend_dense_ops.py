"""vLLM-Ascend's own entries for a dense decoder's ops, on the NPU twin without our hook,
against float32 formulas (`pyruntime.npu_twin.model_ops`).

Run it with a release's environment (``tools/vllm_env.sh RELEASE``)::

    PYTHONPATH=$PWD:$ENV/vllm-ascend $ENV/venv/bin/python tools/vllm_ascend_dense_ops.py

with ``ENV=~/.cache/aicpu-tiling/vllm-envs/<release>``. It prints one JSON line: per entry the
AI Core tasks the twin ran for it (their labels: a torch_npu op's name, ``_C_ascend::<op>`` for
a ``vllm_ascend_C`` custom op, ``triton <kernel>`` for a Triton-Ascend kernel) and the largest
relative error, for two paths:

* ``entries``, the default path, the one an NPU with Triton-Ascend and ``vllm_ascend_C`` takes:
  the twin registers Triton-Ascend's backend (vLLM sets ``HAS_TRITON`` itself) and installs
  the ``vllm_ascend_C`` twin (custom ops on). The tool calls
  ``vllm_ascend.ops.triton.triton_utils.init_device_properties_triton()`` as vLLM-Ascend's
  worker does after choosing its device (``worker/worker.py`` ``NPUWorker._init_device``,
  both releases), since the Triton kernels' grids read it;
* ``fallback_entries``, the torch_npu path of a machine without Triton-Ascend and without
  ``vllm_ascend_C``: the same entries with vLLM-Ascend's own switches off, its module-level
  ``HAS_TRITON`` in ``ops/rotary_embedding.py`` (the one ``rope_forward_oot`` reads at call
  time) and ``vllm_ascend.utils._CUSTOM_OP_ENABLED`` (what ``enable_custom_op()`` returns once
  decided). Both are restored afterwards.

The entries (``vllm_ascend/``): ``ops/layernorm.py`` ``AscendRMSNorm.forward_oot`` on a
hidden state, on Qwen3's per-head q ``[T, heads, D]``, and with a residual
(``_C_ascend.npu_add_rms_norm_bias`` with custom ops on; 0.23 falls back to
``torch_npu.npu_add_rms_norm``, 0.30 calls the custom op unconditionally);
``ops/activation.py`` ``AscendSiluAndMul.forward_oot``; ``ops/rotary_embedding.py``
``rope_forward_oot`` (full and partial rotary: Triton's ``rope_forward_triton`` with
``HAS_TRITON``, else torch_npu); ``device/device_op.py`` ``DeviceOperator.reshape_and_cache``
(0.30: the block-strided K/V views of one allocation its model runner hands out; 0.23:
contiguous caches); ``attention/attention_v1.py``
``AscendAttentionBackendImpl.forward_fused_infer_attention`` in ``PrefillNoCache`` (FIA, TND,
contiguous K/V, sparse_mode 3). The model config is vLLM's own ``ModelConfig`` of the tiny
Qwen3 (`pyruntime.hook.dryrun.tiny_models`) and the process groups are one rank's, made as
the worker makes them (``tools/_vllm_setup.py``).
"""

from __future__ import annotations

import json
import sys
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _vllm_setup  # tools/, beside this file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 128, 4, 2, 64
NUM_BLOCKS, BLOCK_SIZE = 6, 16
#: the entries whose path depends on Triton or on vllm_ascend_C: the fallback pass reruns them
SWITCHED = ("add_rms_norm", "rope_full", "rope_partial")


def main() -> int:
    from pyruntime.hook.dryrun import check_real_vllm_ascend, start_device

    check_real_vllm_ascend()
    device_name = start_device("graph")
    import importlib
    from importlib import metadata

    import torch

    # vllm_ascend.ops first: on 0.23, attention_v1 -> device_op -> ops -> device_op is a cycle
    importlib.import_module("vllm_ascend.ops")
    import vllm_ascend.attention.attention_v1 as attention
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.triton_utils import HAS_TRITON
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.ops.triton.triton_utils import init_device_properties_triton

    from pyruntime.npu_twin import device as twin_device

    # every AI Core task the entry queues, by its label (torch_npu op, _C_ascend::op,
    # "triton <kernel>"), seen where all of them go: the device's enqueue
    ran: list[str] = []
    npu = twin_device.device() if device_name == "npu-twin" else None
    if npu is not None:
        enqueue = npu.enqueue

        def recorded(work, stream=None):
            if work.kind == "aicore":
                ran.append(work.label)
            return enqueue(work, stream)

        npu.enqueue = recorded
    dev, bf16 = torch.device("npu", 0), torch.bfloat16
    torch.npu.set_device(dev)
    # what NPUWorker._init_device does once the device is set: the Triton kernels size
    # their grids from it (a no-op without Triton)
    init_device_properties_triton()
    gen = torch.Generator().manual_seed(0)
    cfg = VllmConfig()
    cfg.model_config = _vllm_setup.model_config("qwen3", max_model_len=256, enforce_eager=True)
    ascend_config = init_ascend_config(cfg)
    _vllm_setup.single_rank_groups(cfg)
    import vllm_ascend.utils as ascend_utils

    if hasattr(ascend_utils, "set_weight_prefetch_method"):
        # 0.23's norms and activation call its prefetch hooks: the model runner sets them
        # (worker/model_runner_v1.py, NPUModelRunner.__init__)
        with set_current_vllm_config(cfg):
            ascend_utils.set_weight_prefetch_method(ascend_config.weight_prefetch_config)
    report: dict = {"vllm_ascend": metadata.version("vllm-ascend"), "device": device_name,
                    "has_triton": bool(HAS_TRITON), "entries": {}, "fallback_entries": {}}
    # vLLM's choice of model runner: V2 needs Triton (vllm/config/vllm.py use_v2_model_runner)
    report["model_runner_v2"] = bool(cfg.use_v2_model_runner)

    def rel(got, want) -> float:
        got, want = got.detach().cpu().double(), want.double()
        return float((got - want).abs().max() / max(1.0, float(want.abs().max())))

    def entry(name: str, run, into: str = "entries") -> None:
        del ran[:]
        try:
            err = run()
            torch.npu.synchronize()
        except Exception as exc:  # noqa: BLE001 (reported: the caller's test decides)
            traceback.print_exc()  # where it failed, on stderr
            report[into][name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            return
        report[into][name] = {"ops": list(ran), "max_rel_err": err}

    def rand(*shape, dtype=bf16):
        return torch.randn(*shape, generator=gen).to(dtype)

    def rms(x, w, eps):
        x = x.float()
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w.float()

    with set_current_vllm_config(cfg):
        from vllm_ascend.ops.activation import AscendSiluAndMul
        from vllm_ascend.ops.layernorm import AscendRMSNorm
        from vllm_ascend.ops.rotary_embedding import rope_forward_oot

        norm = AscendRMSNorm(HIDDEN, eps=1e-6)
        q_norm = AscendRMSNorm(HEAD_DIM, eps=1e-6)
        silu = AscendSiluAndMul()
        impl = attention.AscendAttentionBackendImpl(HEADS, HEAD_DIM, HEAD_DIM ** -0.5,
                                                    KV_HEADS, None, None, "auto", None,
                                                    "decoder", None)
    weight, q_weight = rand(HIDDEN), rand(HEAD_DIM)
    norm.weight = torch.nn.Parameter(weight.to(dev), requires_grad=False)
    q_norm.weight = torch.nn.Parameter(q_weight.to(dev), requires_grad=False)
    x, residual = rand(5, HIDDEN), rand(5, HIDDEN)

    def rms_norm():
        with set_current_vllm_config(cfg):
            out = norm.forward_oot(x.to(dev))
        return rel(out, rms(x, weight, 1e-6))

    def qk_norm():
        q = rand(5, HEADS, HEAD_DIM)
        with set_current_vllm_config(cfg):
            out = q_norm.forward_oot(q.to(dev))
        return rel(out, rms(q, q_weight, 1e-6))

    def add_rms_norm():
        with set_current_vllm_config(cfg):
            out, new_residual = norm.forward_oot(x.to(dev), residual.to(dev))
        total = x.float() + residual.float()
        return max(rel(out, rms(total, weight, 1e-6)), rel(new_residual, total))

    def swiglu():
        h = rand(5, 2 * HIDDEN)
        with set_current_vllm_config(cfg):
            out = silu.forward_oot(h.to(dev))
        gate, up = h.float()[:, :HIDDEN], h.float()[:, HIDDEN:]
        return rel(out, gate * torch.sigmoid(gate) * up)

    def rope(rotary_dim: int):
        def run():
            half = rotary_dim // 2
            inv = 10000 ** (-torch.arange(half) / half)
            angles = torch.arange(64)[:, None] * inv
            cache = torch.cat((angles.cos(), angles.sin()), -1).to(bf16)
            positions = torch.tensor([0, 9, 3, 63, 17])
            q, k = rand(5, HEADS * HEAD_DIM), rand(5, KV_HEADS * HEAD_DIM)
            qo, ko = rope_forward_oot(positions.to(dev), q.to(dev), k.to(dev), cache.to(dev),
                                      HEAD_DIM, rotary_dim, True)
            cos, sin = cache.float()[positions].chunk(2, -1)

            def want(t):
                h = t.float().reshape(5, -1, HEAD_DIM)
                a, b, rest = h[..., :half], h[..., half:rotary_dim], h[..., rotary_dim:]
                c, s = cos[:, None], sin[:, None]
                return torch.cat((a * c - b * s, b * c + a * s, rest), -1).reshape(t.shape)
            return max(rel(qo, want(q)), rel(ko, want(k)))
        return run

    def kv_write():
        from vllm_ascend.device.device_op import DeviceOperator

        page = BLOCK_SIZE * KV_HEADS * HEAD_DIM
        base = torch.zeros(NUM_BLOCKS, 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=bf16,
                           device=dev)
        if report["vllm_ascend"].startswith("0.23"):
            k_cache, v_cache = base[:, 0], base[:, 1]  # separate caches there: dense pages
            k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
        else:  # 0.30: one allocation, K and V pages side by side (model_runner_v1.py)
            shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
            stride = (2 * page, KV_HEADS * HEAD_DIM, HEAD_DIM, 1)
            k_cache = base.as_strided(shape, stride, 0)
            v_cache = base.as_strided(shape, stride, page)
        key, value = rand(4, KV_HEADS, HEAD_DIM), rand(4, KV_HEADS, HEAD_DIM)
        slots = torch.tensor([3, 17, 95, 40], dtype=torch.int32)
        DeviceOperator.reshape_and_cache(key=key.to(dev), value=value.to(dev),
                                         key_cache=k_cache, value_cache=v_cache,
                                         slot_mapping=slots.to(dev))
        report["device_adaptor"] = DeviceOperator.__name__
        kc, vc = k_cache.cpu().float(), v_cache.cpu().float()
        err = 0.0
        for i, slot in enumerate(slots.tolist()):
            err = max(err, rel(kc[slot // BLOCK_SIZE, slot % BLOCK_SIZE], key[i].float()),
                      rel(vc[slot // BLOCK_SIZE, slot % BLOCK_SIZE], value[i].float()))
        written = sum(1 for b in range(NUM_BLOCKS) for r in range(BLOCK_SIZE)
                      if kc[b, r].abs().sum() > 0)
        return err if written == len(slots) else float("inf")

    def prefill():
        ends = [3, 8]
        q = rand(8, HEADS, HEAD_DIM)
        k, v = rand(8, KV_HEADS, HEAD_DIM), rand(8, KV_HEADS, HEAD_DIM)
        mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1).to(dev)
        meta = types.SimpleNamespace(
            attn_state=attention.AscendAttentionState.PrefillNoCache, actual_seq_lengths_q=ends,
            attn_mask=mask, causal=True, num_decodes=0, num_prefills=2, seq_lens_list=ends,
            num_actual_tokens=8)
        output = torch.zeros(8, HEADS, HEAD_DIM, dtype=bf16, device=dev)
        from vllm.forward_context import set_forward_context

        with set_current_vllm_config(cfg), set_forward_context(None, cfg):
            out = impl.forward_fused_infer_attention(q.to(dev), k.to(dev), v.to(dev), meta,
                                                     output)
        group = HEADS // KV_HEADS
        want = torch.zeros(8, HEADS, HEAD_DIM, dtype=torch.float64)
        for q0, q1 in ((0, 3), (3, 8)):
            s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(),
                             k[q0:q1].double().repeat_interleave(group, 1)) * HEAD_DIM ** -0.5
            n = q1 - q0
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            want[q0:q1] = torch.einsum("hqk,khd->qhd", s.softmax(-1),
                                       v[q0:q1].double().repeat_interleave(group, 1))
        return rel(out, want)

    entries = {"rms_norm": rms_norm, "qk_rms_norm": qk_norm, "add_rms_norm": add_rms_norm,
               "silu_and_mul": swiglu, "rope_full": rope(HEAD_DIM),
               "rope_partial": rope(HEAD_DIM // 2), "reshape_and_cache": kv_write,
               "prefill_attention": prefill}
    for name, run in entries.items():
        entry(name, run)
    # the torch_npu path: vLLM-Ascend's own switches off, as without Triton-Ascend and
    # without vllm_ascend_C, then back
    import vllm_ascend.ops.rotary_embedding as rotary

    switches = [(rotary, "HAS_TRITON", False), (ascend_utils, "_CUSTOM_OP_ENABLED", False)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in switches]
    try:
        for module, name, value in switches:
            setattr(module, name, value)
        for name in SWITCHED:
            entry(name, entries[name], into="fallback_entries")
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
