"""The two attention paths behind `pyruntime.attention.StaticAttention`, one concept per module.

- `errors`: the attention API's own exceptions (frozen sizes, bad arguments, state).
- `buffers`: the static buffers of one capture bucket and the validation of step inputs.
- `device_tiling`: the graph whose AI-CPU task plans the tiling for every layer.
- `host_update`: the vLLM-Ascend baseline: per-layer task groups updated from the host.

The kernels both paths launch live in `pyruntime.kernels`.
"""
