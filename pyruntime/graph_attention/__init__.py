"""The pieces behind `pyruntime.attention.StaticAttention`, one concept per module.

- `errors`: the attention API's own exceptions (frozen sizes, bad arguments, state).
- `buffers`: the static buffers of one capture bucket and the validation of step inputs.
- `kernels`: the three device kernels (AI-CPU tiling, AI Core attention, AI Core combine).
- `custom_ops`: the same launches registered as torch custom ops, with fake kernels.
- `device_tiling`: the graph whose AI-CPU task plans the tiling for every layer.
- `host_update`: the vLLM-Ascend baseline: per-layer task groups updated from the host.
"""
