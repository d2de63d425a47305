"""The dry run's one capture/replay loop and its report, for every layer set.

With vLLM and vLLM-Ascend importable, `run` installs the hook with the real engine (on the
NPU twin where no NPU is present: ``pyruntime.npu_twin``), then drives vLLM-Ascend's own
classes the way its model runner does under FULL_DECODE_ONLY: persistent length and
block-table buffers refilled each step, the geometry's metadata, one graph captured per token
bucket with ``forward_context.capturing`` set, then replayed with decode batches from the
bundled trace, uniform padding included, and vLLM-Ascend's own update call after each replay
(``update_full_graph_params`` up to 0.28; the ``UpdatableGraph`` update inside the replay
from 0.29). Every layer's output is compared with a float64 reference, and the twin counts
the graph task updates (``torch.npu.graph_task_update_begin``).

What differs per geometry is passed in as a `Runner` subclass (`pyruntime.hook.dryrun.gqa`:
vLLM-Ascend's ``AscendAttentionMetadataBuilder`` / ``AscendAttentionBackendImpl``;
`pyruntime.hook.dryrun.mla`: its ``AscendMLAImpl``): which modules it imports, how it builds
its layers and metadata, how it checks a step's outputs and describes its layers, and the
fields its report adds. The layer sets are data (`pyruntime.hook.dryrun.models`).

What stands in for vLLM's engine here: the model config (a namespace with the fields these
classes read: no model is loaded), the layers, the queries and the KV cache (random, written
outside the graph, so ``reshape_and_cache`` is not called: key and value are None, as in
vLLM-Ascend's decode-only forward; the GQA caches allocated as the release's model runner
allocates them, `pyruntime.hook.dryrun.kv_caches`). The classes, the hook and the engine are
the real ones.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import MODELS, TOLERANCE, DryRunError, Shape, shape_of, with_captured_sizes

SCHEMA = "aicpu-tiling/hook-dryrun"
REPO = Path(__file__).resolve().parents[3]
#: every field a report can have, in the order it prints them (a set's report has a subset)
REPORT_FIELDS = (
    "schema", "vllm_ascend", "device", "placement", "aicore_body", "spec_tokens", "model",
    "layers", "device_layers", "steps", "host_layers", "updates_per_step_before",
    "updates_per_step_after", "updates_per_step_all", "updates_per_step_host_layers",
    "updates_skipped", "max_rel_err", "max_rel_err_before", "rope_distance", "tolerance",
    "dtype", "seconds", "steps_with_split_units", "tilings_per_graph",
    "tiling_launches_per_step", "captured_sizes", "host_waits_per_step_before",
    "host_waits_per_step_after", "ok")
#: the host waits counted per replayed step (the twin's `Device.stats` names): blocking copies
#: either way and explicit synchronizes, torch_npu's rules (`pyruntime.npu_twin.device`)
HOST_WAITS = ("copies_h2d_blocking", "copies_d2h", "synchronizes")


@dataclass
class Run:
    """One run in one process: with the hook (``hooked``) or vLLM-Ascend's own path."""

    hooked: bool
    vllm_ascend: str
    device: str
    placement: str
    spec_tokens: int = 0
    model: str = "mixed"
    layers: list[dict] = field(default_factory=list)
    steps: int = 0
    updates_per_step: float = 0.0
    max_rel_err: float = float("nan")
    seconds: float = 0.0
    #: replayed steps whose tiling split a unit over cores, so that the combine merged its
    #: pieces (and added the sinks of those rows); None without the hook or the NPU engine
    steps_with_split_units: int | None = None
    #: the most tilings a graph key holds (one per distinct window of its layers) and the
    #: AI-CPU launches per replayed step that plan them (pre-replay: counted at each step;
    #: graph: captured per key, each replay runs them); None without the NPU engine
    tilings_per_graph: int | None = None
    tiling_launches_per_step: float | None = None
    #: update calls the hook skipped (its graphs' layers all ours); the MLA run reports it
    updates_skipped: int | None = None
    #: the model dtype and the largest relative error against float64 it allows
    dtype: str = "float32"
    tolerance: float = TOLERANCE
    #: graphs captured (token buckets), and the host waits per replayed step inside
    #: vLLM-Ascend's classes (`HOST_WAITS`: the replay through ``ACLGraphWrapper``, the
    #: hook's ``before_replay`` in it, vLLM-Ascend's update after it); None off the twin
    captured_sizes: int = 0
    host_waits_per_step: dict | None = None


def check_real_vllm_ascend() -> Path:
    """The real vLLM-Ascend's ``vllm_ascend/__init__.py``; raises `DryRunError` otherwise."""
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or spec.origin is None:
        raise DryRunError("vllm_ascend is not importable: run it where vLLM-Ascend is "
                          "installed (or tools/vllm_env.sh RELEASE makes such an environment)")
    origin = Path(spec.origin).resolve()
    if (REPO / "tests" / "fixtures") in origin.parents:
        raise DryRunError(f"vllm_ascend resolves to the test fixture package ({origin}); the "
                          "dry run needs the real vLLM-Ascend")
    if importlib.util.find_spec("vllm") is None:
        raise DryRunError("vllm is not importable")
    return origin


def start_device(placement: str) -> str:
    """The device the run uses: an NPU when torch_npu is installed, else the twin."""
    os.environ["AICPU_TILING_PLACEMENT"] = placement  # the engine reads it (pyruntime.placement)
    if importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    from pyruntime import npu_twin

    # the C reference body of our AI Core ops: the Triton bodies are checked elsewhere
    os.environ.setdefault(npu_twin.AICORE_ENV, "reference")
    npu_twin.activate()
    return "npu-twin"


class UpdateCounter:
    """Counts graph task updates (``torch.npu.graph_task_update_begin``) and which query
    buffer each one's FIA reads (``torch_npu.npu_fused_infer_attention_score.out`` issued
    between update begin and end), so updates can be told apart per layer."""

    def __init__(self, torch: Any) -> None:
        import torch_npu

        self.count = 0
        self.queries: list[int] = []  # data_ptr of the query of each update's FIA
        self._updating = False
        begin, end = torch.npu.graph_task_update_begin, torch.npu.graph_task_update_end

        def counted_begin(*args, **kwargs):
            self.count += 1
            self._updating = True
            return begin(*args, **kwargs)

        def counted_end(*args, **kwargs):
            self._updating = False
            return end(*args, **kwargs)

        for module in (torch.npu, torch_npu.npu):
            if getattr(module, "graph_task_update_begin", None) is begin:
                module.graph_task_update_begin = counted_begin
                module.graph_task_update_end = counted_end
        packet = torch_npu.npu_fused_infer_attention_score
        out = packet.out

        def out_seen(*args, **kwargs):
            if self._updating:
                query = kwargs.get("query", args[0] if args else None)
                self.queries.append(query.data_ptr())
            return out(*args, **kwargs)

        class _Packet:  # the packet, its .out counted; vLLM-Ascend looks it up when it calls
            def __call__(self, *args, **kwargs):
                return packet(*args, **kwargs)

            def __getattr__(self, name):
                return out_seen if name == "out" else getattr(packet, name)

        torch_npu.npu_fused_infer_attention_score = _Packet()

    def reset(self) -> None:
        self.count, self.queries = 0, []


def split_this_step(engine: Any) -> bool:
    """True when a tiling the NPU engine planned for its current step split a unit (read
    back from the device after the step, outside any capture)."""
    from pyruntime import tiling
    from pyruntime.kernels.step import tiling_status

    current = engine.device_epoch()
    for key in engine.keys.values():
        planned = tiling_status(key.params, key.tiling)
        if (planned.epoch == current and planned.status == tiling.OK
                and planned.num_slots > 0):
            return True
    return False


def trace_steps(shape: Any, steps: int, seed: int):
    """Decode batches (q_len 1) of random size whose kv lengths are the bundled trace's
    context lengths folded into the dry run's small cache (1 + (context - 1) mod capacity;
    with ``kv_min`` > 1, capacity - (context - 1) mod (capacity - kv_min + 1))."""
    import numpy as np

    from pyruntime.workload.trace import load_trace

    rng = np.random.default_rng(seed)
    cap, q = shape.max_blocks_per_req * shape.block_size, shape.q_len
    low, span = max(1, shape.kv_min), cap - max(1, shape.kv_min) + 1
    # with a kv_min (the model sets) folded down from the capacity, so that the trace's mostly
    # short contexts land past the window
    lengths = [max(q, (low + offset) if low == 1 else (cap - offset))
               for offset in ((max(r.context_tokens, 1) - 1) % span
                              for r in load_trace(limit=500))]
    most = min(shape.max_reqs, max(shape.buckets) // q)
    for _ in range(steps):
        n = int(rng.integers(1, most + 1))
        yield [q] * n, [int(x) for x in rng.choice(lengths, n)]


class Runner:
    """vLLM-Ascend's model runner, reduced to the decode of FULL_DECODE_ONLY: what every
    geometry shares (the config, the persistent buffers, a step, the captures). A geometry
    subclasses it (`pyruntime.hook.dryrun.gqa.Runner`, `pyruntime.hook.dryrun.mla.Runner`).

    Made before vLLM is imported (``__init__`` only stores); `build` makes vLLM-Ascend's
    objects once the modules in `modules` are imported (under the hook, when hooked).
    """

    #: vLLM-Ascend's modules, imported in this order before `build`: its custom ops first, as
    #: its worker loads them before any model module (in 0.23 importing attention_v1 first
    #: is a circular import through device_op); the hook patches them as they import
    modules: tuple[str, ...] = ("vllm_ascend.ops", "vllm_ascend.attention.attention_v1",
                                "vllm_ascend.compilation.acl_graph")
    #: whether vLLM-Ascend's own path (no hook) can run this geometry on the twin
    runs_unhooked = True
    #: the report's schema
    schema = SCHEMA
    #: the fields of vLLM's SpeculativeConfig this geometry's classes read, besides the common
    spec_fields: dict = {}
    #: every layer has sinks (``forward_context.sinks``); the backend's graphs update in their
    #: replay (0.29+ ``UpdatableGraph``) rather than by ``update_full_graph_params``; a C8-like
    #: eager warm-up step before each capture
    all_sinks = False
    updatable = False
    warm_up = False

    def __init__(self, shape: Any, seed: int, hooked: bool = True) -> None:
        self.shape, self.seed, self.hooked = shape, seed, hooked
        #: the twin device's counters (None on an NPU) and the host waits counted in the
        #: replayed steps' model-runner part (`step`), once `counting` is set
        self.twin_stats: Any = None
        self.counting = False
        self.host_waits = dict.fromkeys(HOST_WAITS, 0)

    # -- what a geometry provides ---------------------------------------------------------

    def before_import(self) -> None:
        """Before vLLM-Ascend's modules are imported (after the hook is installed)."""

    def use_engine(self, engine: Any) -> None:
        """The hook's engine, before `build` (None without the hook)."""

    def build(self) -> None:
        """vLLM-Ascend's objects, the caches and buffers, `inputs`, `outputs`, `wrapper`."""
        raise NotImplementedError

    def metadata(self, q_lens: list[int], kv_lens: list[int], table, bucket: int) -> Any:
        """The attention metadata of one step (the same object for every layer)."""
        raise NotImplementedError

    def begin(self, on_host: dict) -> None:
        """After the captures: the replayed steps' checks start (`on_host`: the layers the
        hook left on vLLM-Ascend's path, with its reasons)."""

    def check(self, q_lens: list[int], kv_lens: list[int], table, outs: list) -> None:
        """Compare one replayed step's outputs with float64 (accumulated per layer)."""
        raise NotImplementedError

    @property
    def max_rel_err(self) -> float:
        raise NotImplementedError

    def layers(self, status: Any, counter: UpdateCounter, steps: int) -> list[dict]:
        """The report's ``layers``: each layer's path, entry, errors and distances."""
        raise NotImplementedError

    def run_fields(self, status: Any) -> dict:
        """`Run` fields of this geometry only."""
        return {}

    @staticmethod
    def report_fields(after: Run, before: Run | None, counts: dict) -> tuple[dict, bool]:
        """The report's fields of this geometry only, and what its verdict adds (`counts`:
        ``device_layers``, ``host_layers``, ``on_ours``)."""
        return {}, True

    # -- what they share ------------------------------------------------------------------

    def _config(self, **model_fields) -> Any:
        """vLLM's config for FULL_DECODE_ONLY with a namespace for the model config (the
        fields these classes read); `init_ascend_config` run on it."""
        import torch
        from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
        from vllm_ascend.ascend_config import init_ascend_config

        self.torch, self.mode = torch, CUDAGraphMode
        self.set_current_vllm_config = set_current_vllm_config
        # these are the V1 model runner's classes and buffers; vLLM 0.30 picks Model Runner
        # V2 by default wherever Triton is usable (vllm/config/vllm.py
        # `VllmConfig.use_v2_model_runner`: HAS_TRITON and no unsupported feature), as on an
        # NPU with Triton-Ascend and on the twin, whose Triton-Ascend backend is active
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        self.device = torch.device("npu", 0)
        s = self.shape
        cfg = VllmConfig()
        cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        if s.spec_tokens:  # the fields of vLLM's SpeculativeConfig these classes read
            cfg.speculative_config = types.SimpleNamespace(
                method="mtp", num_speculative_tokens=s.spec_tokens, parallel_drafting=False,
                num_speculative_tokens_per_batch_size=None, draft_model_config=None,
                **self.spec_fields)
        self._quant_config(cfg)
        cfg.model_config = types.SimpleNamespace(
            max_model_len=s.max_blocks_per_req * s.block_size, runner_type="generate",
            hf_text_config=None, is_hybrid=False, enforce_eager=False, quantization=None,
            **model_fields)
        init_ascend_config(cfg)
        self.names = [f"model.layers.{i}.self_attn.attn" for i in range(s.num_layers)]
        return cfg

    def _quant_config(self, cfg: Any) -> None:
        """A geometry's quant config on `cfg`, if any."""

    def _buffers(self, query_start_len: int) -> None:
        """The model runner's persistent host and device buffers: query start offsets
        (`query_start_len` entries), kv lengths and the block table."""
        torch, s, dev, i32 = self.torch, self.shape, self.device, self.torch.int32
        self.qsl_cpu = torch.zeros(query_start_len, dtype=i32)
        self.qsl = torch.zeros(query_start_len, dtype=i32, device=dev)
        self.seq_lens_cpu = torch.zeros(s.max_reqs, dtype=i32)
        self.seq_lens = torch.zeros(s.max_reqs, dtype=i32, device=dev)
        self.table_cpu = torch.zeros(s.max_reqs, s.max_blocks_per_req, dtype=i32)
        self.table = torch.zeros(s.max_reqs, s.max_blocks_per_req, dtype=i32, device=dev)

    def _fill(self, q_lens: list[int], kv_lens: list[int], table, bucket: int,
              pad: int) -> Any:
        """Fill the persistent buffers as the model runner does (uniform decode padding: q_len
        q, kv_len 0; the query start offsets past the padded batch hold `pad`) and copy them
        to the device; returns the host query start offsets."""
        torch, q, n = self.torch, self.shape.q_len, len(q_lens)
        padded = bucket // q
        cu = self.qsl_cpu
        cu.fill_(pad)
        cu[0] = 0
        cu[1: n + 1] = torch.tensor(q_lens).cumsum(0)
        cu[n + 1: padded + 1] = cu[n] + torch.arange(1, padded - n + 1) * q
        self.seq_lens_cpu.zero_()
        self.seq_lens_cpu[:n] = torch.tensor(kv_lens)
        self.table_cpu.zero_()
        self.table_cpu[:n, : table.shape[1]] = table
        for device_buffer, host in ((self.qsl, cu), (self.seq_lens, self.seq_lens_cpu),
                                    (self.table, self.table_cpu)):
            device_buffer.copy_(host.pin_memory(), non_blocking=True)
        return cu

    def step(self, q_lens: list[int], kv_lens: list[int], table, eager: bool = False) -> list:
        """One decode step in the bucket that holds it; returns each layer's output rows.
        ``eager``: run without a graph (cudagraph mode NONE), as vLLM's warm-up runs do."""
        from vllm.forward_context import BatchDescriptor, get_forward_context, set_forward_context

        bucket = next(b for b in self.shape.buckets if b >= sum(q_lens))
        metas = dict.fromkeys(self.names, self.metadata(q_lens, kv_lens, table, bucket))
        descriptor = BatchDescriptor(num_tokens=bucket, num_reqs=bucket // self.shape.q_len,
                                     uniform=True)
        mode = self.mode.NONE if eager else self.mode.FULL
        with self.set_current_vllm_config(self.cfg), set_forward_context(
                metas, self.cfg, num_tokens=bucket, cudagraph_runtime_mode=mode,
                batch_descriptor=descriptor):
            context = get_forward_context()
            # the fields vLLM-Ascend's set_ascend_forward_context sets that attention reads
            # (the rest of it sets up MoE communication, which needs a distributed group)
            for name, value in (("capturing", False), ("is_draft_model", False),
                                ("is_draft_model_prefill", False), ("sinks", self.all_sinks),
                                ("in_profile_run", False), ("num_tokens", bucket)):
                setattr(context, name, value)
            counted = self.counting and not eager and self.twin_stats is not None
            before = {k: self.twin_stats[k] for k in HOST_WAITS} if counted else None
            self.wrapper(metas, bucket)
            # the model runner's update after the replay, never after a capture (its
            # _update_full_graph_params_if_needed checks forward_context.capturing: an update
            # then would record the ExternalEvent that the next replay's wait consumes early)
            if not self.updatable and not context.capturing and not eager:
                self.acl_graph.update_full_graph_params(
                    self.backend, self.update_stream, context, bucket, self.cfg,
                    self.cfg.speculative_config)
            if before is not None:  # the replay and its update: what vLLM-Ascend's runner does
                for k in HOST_WAITS:
                    self.host_waits[k] += self.twin_stats[k] - before[k]
        self.torch.npu.synchronize()  # the dry run's own reads: not counted
        return [o.cpu() for o in self.outputs]

    def capture(self) -> None:
        """One capture per bucket with a dummy uniform batch, as capture_model does; with
        `warm_up`, after an eager warm-up step per bucket (vLLM's warm-up runs before each
        capture)."""
        torch, q = self.torch, self.shape.q_len
        for bucket in self.shape.buckets:
            n = bucket // q
            if self.warm_up:
                self.step([q] * n, [q] * n, torch.zeros(n, 1, dtype=torch.int32), eager=True)
            self.step([q] * n, [q] * n, torch.zeros(n, 1, dtype=torch.int32))


def geometry(shape: Any) -> type[Runner]:
    """The `Runner` of `shape`'s geometry (its module in this package)."""
    return importlib.import_module(f"{__package__}.{shape.geometry}").Runner


def run(*, placement: str = "graph", steps: int | None = None, seed: int = 0,
        shape: Any = None, hooked: bool = True) -> Run:
    """One run in this process (once per process: the twin and the hook stay installed);
    `steps` defaults to the shape's ``default_steps``.

    Raises:
        DryRunError: vLLM or the real vLLM-Ascend is not importable, or (``hooked``) the hook
            did not become active (its reason).
    """
    started = time.perf_counter()
    check_real_vllm_ascend()
    device = start_device(placement)
    import torch

    from pyruntime import hook
    from pyruntime.hook import activation

    shape = shape or Shape()
    steps = shape.default_steps if steps is None else steps
    runner = geometry(shape)(shape, seed=seed, hooked=hooked)
    if not hooked and not runner.runs_unhooked:
        raise DryRunError(f"--model {shape.model} runs with the hook only")
    if hooked:
        installed = hook.install()
        if installed.state not in ("waiting", "active"):
            raise DryRunError(f"the hook did not install: {installed.reason}")
    counter = UpdateCounter(torch)
    runner.before_import()
    for module in runner.modules:
        importlib.import_module(module)
    status = hook.status()
    if hooked and status.state != "active":
        raise DryRunError(f"the hook is not active: {status.reason}")
    engine = activation._state.engine if hooked and activation._state is not None else None
    runner.use_engine(engine)
    from importlib import metadata

    version = metadata.version("vllm-ascend")
    if device == "npu-twin":
        from pyruntime.npu_twin import device as twin_device

        runner.twin_stats = twin_device.device().stats
    runner.build()
    runner.capture()
    runner.counting = True
    counter.reset()
    runner.begin(dict(hook.status().host_path_layers) if hooked else {})
    split_steps = 0 if hasattr(engine, "keys") else None  # the NPU engine's per-key buffers
    launches_before = getattr(engine, "tiling_launches", 0)
    done = 0
    for q_lens, kv_lens in trace_steps(shape, steps, seed):
        for t in runner.inputs:
            t.copy_(torch.randn(t.shape, generator=runner.gen))
        blocks = -(-max(kv_lens) // shape.block_size)
        table = torch.randperm(shape.num_blocks, generator=runner.gen)[
            : len(q_lens) * blocks].view(len(q_lens), blocks).int()
        outs = runner.step(q_lens, kv_lens, table)
        if split_steps is not None:
            split_steps += split_this_step(engine)
        runner.check(q_lens, kv_lens, table, outs)
        done += 1
    tilings_per_graph = launches_per_step = None
    if split_steps is not None and engine.keys:
        tilings_per_graph = max(len(key.tilings) for key in engine.keys.values())
        launches_per_step = (engine.tiling_launches / len(engine.keys)
                             if placement == "graph"
                             else (engine.tiling_launches - launches_before) / max(done, 1))
    status = hook.status()
    if hooked and status.engine != f"npu-{placement}":
        raise DryRunError(f"the hook captured into engine {status.engine}, not npu-{placement}")
    return Run(hooked=hooked, vllm_ascend=version, device=device, placement=placement,
               spec_tokens=shape.spec_tokens, model=shape.model,
               layers=runner.layers(status, counter, done), steps=done,
               updates_per_step=counter.count / max(done, 1),
               max_rel_err=runner.max_rel_err, seconds=round(time.perf_counter() - started, 1),
               steps_with_split_units=split_steps, tilings_per_graph=tilings_per_graph,
               tiling_launches_per_step=launches_per_step, dtype=shape.dtype,
               tolerance=shape.tolerance, captured_sizes=len(shape.buckets),
               host_waits_per_step=(None if runner.twin_stats is None else
                                    {k: v / max(done, 1) for k, v in runner.host_waits.items()}),
               **runner.run_fields(status))


def report(after: Run, before: Run | None = None) -> dict:
    """What ``hook-dryrun --json`` prints: the run with the hook (`after`), against the run
    without it (`before`) where the set has one.

    ``ok`` holds when at least one layer moved to the device path, no layer of ours was
    host-updated, the hooked outputs (the host-path layers' included) match the float64
    reference within the run's tolerance (`TOLERANCES` of its dtype), the hook added no host
    wait per step (`HOST_WAITS`, where the twin counted both runs) and what the geometry adds
    holds (`Runner.report_fields`).
    """
    runner = geometry(MODELS[after.model][0])
    device_layers = sum(1 for layer in after.layers if layer["path"] == "device")
    host_layers = sum(1 for layer in after.layers if layer["path"] == "host")
    # the updates on the layers the hook took over (0 when it works); the layers it leaves
    # keep vLLM-Ascend's updates
    on_ours = sum(layer["updates_per_step"] or 0 for layer in after.layers
                  if layer["path"] == "device")
    own, verdict = runner.report_fields(after, before, {
        "device_layers": device_layers, "host_layers": host_layers, "on_ours": on_ours})
    runs = [r for r in (before, after) if r is not None]
    out = {"schema": runner.schema, "vllm_ascend": after.vllm_ascend, "device": after.device,
           "placement": after.placement, "spec_tokens": after.spec_tokens,
           "layers": after.layers, "device_layers": device_layers, "steps": after.steps,
           "max_rel_err": after.max_rel_err, "tolerance": after.tolerance,
           "seconds": round(sum(r.seconds for r in runs), 1),
           "steps_with_split_units": after.steps_with_split_units,
           "captured_sizes": after.captured_sizes,
           "host_waits_per_step_after": after.host_waits_per_step, **own}
    if before is not None:
        out["host_waits_per_step_before"] = before.host_waits_per_step
    waits = [after.host_waits_per_step, before and before.host_waits_per_step]
    no_added_waits = None in waits or all(waits[0][k] <= waits[1][k] for k in HOST_WAITS)
    out["ok"] = bool(device_layers > 0 and on_ours == 0 and after.max_rel_err <= after.tolerance
                     and no_added_waits and verdict)
    return {name: out[name] for name in REPORT_FIELDS if name in out}


def run_in_child(*, hooked: bool, placement: str, steps: int, spec_tokens: int = 0,
                 model: str = "mixed", captured_sizes: int | None = None,
                 timeout_s: float = 600) -> Any:
    """`run` in a fresh interpreter (the twin and the hook are once per process): what the
    child prints (`main`)."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "AICPU_TILING"}  # no autostart hook
    cmd = [sys.executable, "-m", __package__, "--placement", placement,
           "--steps", str(steps), "--spec-tokens", str(spec_tokens), "--model", model,
           *([] if captured_sizes is None else ["--captured-sizes", str(captured_sizes)]),
           *([] if hooked else ["--no-hook"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        which = ("MLA" if MODELS[model][0].geometry == "mla"
                 else "hooked" if hooked else "unhooked")
        raise DryRunError(f"the {which} run failed: {tail}")
    result = json.loads(lines[-1])
    return Run(**result) if "hooked" in result else result


def dry_run(*, model: str = "mixed", placement: str = "graph", steps: int = 6,
            spec_tokens: int = 0, captured_sizes: int | None = None) -> dict:
    """``aicpu-tiling hook-dryrun``: the set's run without the hook and with it (the hooked
    one only, for a set vLLM-Ascend's own path cannot run here), each in a fresh interpreter;
    their `report`.

    Raises:
        DryRunError: a run cannot start here or failed.
    """
    check_real_vllm_ascend()
    options = {"placement": placement, "steps": steps, "spec_tokens": spec_tokens,
               "model": model, "captured_sizes": captured_sizes}
    if not geometry(MODELS[model][0]).runs_unhooked:
        return run_in_child(hooked=True, **options)  # the child's report
    before = run_in_child(hooked=False, **options)
    after = run_in_child(hooked=True, **options)
    return report(after, before)


def main(argv: list[str] | None = None) -> int:
    """The child process (``python -m pyruntime.hook.dryrun``): one `run`, as one JSON line on
    stdout: its `Run`, which the parent pairs with the other run; for a set that has the
    hooked run only (``--model mla``), its `report`."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=f"python -m {__package__}")
    parser.add_argument("--placement", default="graph", choices=("graph", "pre-replay"))
    parser.add_argument("--steps", type=int, default=None,
                        help="default: 6, or 4 for --model mla")
    parser.add_argument("--spec-tokens", type=int, default=0)
    parser.add_argument("--model", default="mixed", choices=tuple(MODELS))
    parser.add_argument("--no-hook", action="store_true")
    parser.add_argument("--captured-sizes", type=int, default=None,
                        help="capture this many token buckets, 1..N tokens (default: the "
                             "set's own)")
    mla = parser.add_argument_group("--model mla only")
    mla.add_argument("--fault", choices=("drop-rope",), default=None)
    mla.add_argument("--host-layers", default=None,
                     help="comma-separated layer indices built with enable_kv_nz (a mixed "
                          "graph)")
    mla.add_argument("--num-heads", type=int, default=None,
                     help="query heads per rank (default 16: DeepSeek-V3 at TP 8); one "
                          "that is not a power of two takes vLLM-Ascend's head padding")
    args = parser.parse_args(argv)
    fields = {"spec_tokens": args.spec_tokens}
    if args.fault is not None:
        fields["fault"] = args.fault
    if args.host_layers is not None:
        fields["host_layers"] = tuple(int(i) for i in args.host_layers.split(",") if i)
    if args.num_heads is not None:
        fields["num_heads"] = args.num_heads
    if len(fields) > 1 and MODELS[args.model][0].geometry != "mla":
        parser.error("--fault, --host-layers and --num-heads take --model mla")
    shape = shape_of(args.model, **fields)
    if args.captured_sizes is not None:
        shape = with_captured_sizes(shape, args.captured_sizes)
    result = run(placement=args.placement, steps=args.steps, hooked=not args.no_hook,
                 shape=shape)
    paired = geometry(shape).runs_unhooked
    print(json.dumps(result.__dict__ if paired else report(result)))
    return 0
