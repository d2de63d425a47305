"""The device kernels, in one place: what runs on the AI-CPU and on the AI Cores.

- `kernel`: what a kernel is (`Kernel`, its kinds ``AICPU`` / ``AICORE``) and how one fails
  (`AttentionKernelError`); the backends launch these and re-export `Kernel`.
- `step`: the three kernels of one attention step as `Kernel`s (AI-CPU tiling,
  AI Core attention, AI Core combine), each with a CPU body and an NPU op, and
  `launch_layer`, which both attention paths use.
- `reference_attention`: the C reference attention (``aicpu_kernels/attention_ref.c``), the
  AI Core role on the CPU backend.
- `triton_attention`: the same AI Core role as Triton kernels (fixed-grid paged attention and
  combine driven by the tiling), one source for Triton's interpreter on CPU tensors and
  Triton-Ascend on an NPU; `triton_launch` launches them (``tools/ascend_compile.py``
  compiles them for Ascend910B3 as far as public wheels go).
- `mla_step`: the MLA decode step's AI Core kernels (the tiling is `step`'s).
- `custom_ops`: the same launches as torch custom ops (``torch.ops.aicpu_tiling.*``): the
  schemas; `step` and `mla_step` hand it their bodies, so it imports neither.

The C tiling kernel itself is ``aicpu_kernels/aicpu_tiling.c``, reached through
`pyruntime.tiling`.
"""
