"""Tiny random decoders the engine check writes itself (``serve-check --tiny NAME``): a
``config.json`` and random safetensors weights from a fixed seed, no download, no tokenizer
(the check passes prompt token ids and vLLM runs with ``skip_tokenizer_init=True``).

Three shapes, each the real model's architecture with its smallest sizes (the names match
``hook-dryrun --model`` where the models are the same):

* ``qwen3``: ``Qwen3ForCausalLM``, a dense GQA decoder (q/k RMSNorm), 4 query heads, 2 KV
  heads, head_dim 64 (Qwen3's own head_dim is 128). vLLM-Ascend's ``AscendAttentionBackend``
  declares no head-size list, and vLLM's base class then accepts any head size
  (``vllm/v1/attention/backend.py``: ``get_supported_head_sizes`` returns ``[]``,
  ``supports_head_size`` is True for an empty list); 64 is the probe's
  (``engine-on-twin-probe-2026-12``).
* ``gpt-oss``: ``GptOssForCausalLM``: attention sinks on every layer, a sliding window on the
  even layers (transformers ``GptOssConfig.layer_types``; vLLM ``gpt_oss.py``:
  ``sliding_window if layer_idx % 2 == 0``), 4 experts, 2 per token (gpt-oss is MoE on every
  layer; unquantized bf16 weights, no ``quantization_config``). Window 16, small enough for
  a check's decode steps to pass it, but only from ``--max-tokens`` 11 on (the longest prompt
  is 7 tokens; the default 10 stays within the window).
* ``deepseek-v3``: ``DeepseekV3ForCausalLM``, MLA with DeepSeek-V3's latent geometry
  (``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` 128, ``v_head_dim``
  128: the geometry of ``hook-dryrun --model mla``), which is also the only one vLLM-Ascend's
  decode kernel takes (``vllm_ascend/attention/mla_v1.py``: "FIA MLA requires rope D=64 ...
  the kv_lora_rank=512 MLA kernel"); 16 heads, one TP-8 rank of its 128 as in the dry run
  (``AscendMLAImpl`` pads any count to a power of two, ``num_heads_padded``), and
  ``first_k_dense_replace`` equal to the layer count, so every layer's MLP is dense (no MoE).

The configs are data (`CONFIGS`, checked without transformers); `write` needs transformers
and torch (the vLLM environments have both): it builds the model from the config under
``torch.manual_seed(seed)`` and saves it with ``save_pretrained`` (safetensors), so the
weight names are the ones transformers and vLLM's loaders read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the weights' dtype (vLLM serves the config's ``torch_dtype``; bf16 as the real checkpoints)
DTYPE = "bfloat16"
#: the tiny models' vocabulary: ids 0..VOCAB-1; prompts are drawn from it
VOCAB = 512
SEED = 1234
#: weights drawn N(0, INIT_STD): larger than transformers' 0.02 so that a random model's
#: logits spread over a few units and greedy decoding has clear winners at most steps
INIT_STD = 0.2

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "initializer_range": INIT_STD,
    "tie_word_embeddings": False,
    "torch_dtype": DTYPE,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

#: name -> transformers config fields (``model_type`` and ``architectures`` included)
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3": {
        **_COMMON,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rope_theta": 1000000.0,
        "attention_bias": False,
    },
    "gpt-oss": {
        **_COMMON,
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 256,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_theta": 150000.0,
        # gpt-oss's YaRN: factor 32 over 4096 positions (openai/gpt-oss-20b config.json)
        "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        "attention_bias": True,
    },
    "deepseek-v3": {
        **_COMMON,
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": 256,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "first_k_dense_replace": 2,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "n_group": 1,
        "topk_group": 1,
        "rope_theta": 10000.0,
        "rope_scaling": None,
    },
}
#: the attention layers of each model, as vLLM names them (``model.layers.I.self_attn.attn``
#: for the GQA models; vLLM's ``DeepseekV2MLAAttention`` holds ``mla_attn``)
ATTENTION_LAYERS = {
    "qwen3": [f"model.layers.{i}.self_attn.attn" for i in range(2)],
    "gpt-oss": [f"model.layers.{i}.attn.attn" for i in range(2)],
    "deepseek-v3": [f"model.layers.{i}.self_attn.mla_attn" for i in range(2)],
}


class TinyModelError(RuntimeError):
    """A tiny model cannot be written here (says why)."""


def write(name: str, directory: str | Path, seed: int = SEED) -> Path:
    """Write the tiny model `name` (a key of `CONFIGS`) into `directory` (made if missing):
    ``config.json``, ``generation_config.json`` and ``model.safetensors`` ({DTYPE} weights
    drawn with ``torch.manual_seed(seed)``). The same name and seed give the same bytes.
    Returns the directory. Raises `TinyModelError` for an unknown name or without
    transformers."""
    if name not in CONFIGS:
        raise TinyModelError(f"unknown tiny model {name!r}; choose from {', '.join(CONFIGS)}")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TinyModelError(f"writing a tiny model needs transformers and torch ({exc}); "
                             "run it in a vLLM environment (tools/vllm_env.sh)") from exc
    fields = dict(CONFIGS[name])
    model_type = fields.pop("model_type")
    fields.pop("architectures")
    dtype = getattr(torch, fields.pop("torch_dtype"))
    config = transformers.AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # every weight N(0, INIT_STD), norms 1: the same on every release
        for pname, param in sorted(model.named_parameters()):
            if "norm" in pname:
                param.fill_(1.0)
            else:
                param.normal_(0.0, INIT_STD)
    model = model.to(dtype)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.disable_progress_bar()  # serve-check's output stays its own
    model.save_pretrained(out, safe_serialization=True)
    # the config as written is the data above (transformers adds its defaults); keep the
    # dtype field vLLM reads on every release
    config_path = out / "config.json"
    written = json.loads(config_path.read_text())
    written["torch_dtype"] = DTYPE
    config_path.write_text(json.dumps(written, indent=2, sort_keys=True))
    return out


#: the tiny LoRA adapter (``serve-check --lora``): rank, alpha, and the projections it adapts
#: (vLLM's ``PEFTHelper`` reads ``r``, ``lora_alpha``, ``target_modules`` from
#: ``adapter_config.json``; ``LoRAModel.from_local_checkpoint`` reads
#: ``adapter_model.safetensors``, names ``base_model.model.<module>.lora_A/lora_B.weight``)
LORA_RANK = 8
LORA_ALPHA = 16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
#: the models whose attention projections have the names above (``self_attn.q_proj``, ...)
LORA_MODELS = ("qwen3",)


def lora_shapes(name: str) -> dict[str, tuple[int, int]]:
    """Each adapted module of tiny model `name` (a key of `LORA_MODELS`) -> its weight's
    ``(out_features, in_features)``, as transformers names the module."""
    if name not in LORA_MODELS:
        raise TinyModelError(f"--lora: a tiny adapter is written for {', '.join(LORA_MODELS)} "
                             f"only, not {name!r}")
    c = CONFIGS[name]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    outs = {"q_proj": (q, c["hidden_size"]), "k_proj": (kv, c["hidden_size"]),
            "v_proj": (kv, c["hidden_size"]), "o_proj": (c["hidden_size"], q)}
    return {f"model.layers.{i}.self_attn.{m}": outs[m]
            for i in range(c["num_hidden_layers"]) for m in LORA_TARGETS}


def write_lora(name: str, directory: str | Path, seed: int = SEED + 1) -> Path:
    """Write a random LoRA adapter for tiny model `name` into `directory`: PEFT's
    ``adapter_config.json`` and ``adapter_model.safetensors`` (A and B drawn N(0, INIT_STD) in
    float32 from ``torch.manual_seed(seed)``; B is not zero, so the adapter changes the
    tokens). Returns the directory."""
    import torch
    from safetensors.torch import save_file

    shapes = lora_shapes(name)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (out_features, in_features) in shapes.items():
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(
            LORA_RANK, in_features, generator=generator) * INIT_STD
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(
            out_features, LORA_RANK, generator=generator) * INIT_STD
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": LORA_ALPHA,
              "target_modules": list(LORA_TARGETS), "bias": "none", "lora_dropout": 0.0,
              "task_type": "CAUSAL_LM", "base_model_name_or_path": None}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return out


def merge_lora(model: Any, adapter: str | Path) -> Any:
    """Fold the adapter at `adapter` into a transformers `model` in place (W += alpha / r * B
    A, PEFT's LoRA scaling): the fp32 reference of the requests that use it. Returns it."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                continue
            module = key[len("base_model.model."):-len(".lora_A.weight")]
            b = tensors[key.replace("lora_A", "lora_B")]
            weight = modules[module].weight
            weight += (scale * (b.double() @ a.double())).to(weight.dtype)
    return model
