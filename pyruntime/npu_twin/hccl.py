"""HCCL on the twin: ``torch_npu._C._distributed_c10d.ProcessGroupHCCL`` and the ``hccl`` backend
of ``torch.distributed``, whose collectives run over gloo on the npu tensors' host memory, as
device work in stream order.

What it stands in for (torch_npu 2.10.0.post4 wheel; Ascend/pytorch's
``torch_npu/csrc/distributed/ProcessGroupHCCL.cpp``, ``.hpp`` and ``Init.cpp`` at master
9e73e708a, whose messages quoted here are all in the wheel's ``lib/libtorch_npu.so``):

* ``torch_npu/_init/registry/distributed.py`` registers the backend at ``import torch_npu``:
  ``torch.distributed.Backend.register_backend("hccl", ..., extended_api=True,
  devices=["npu"])``; its creator takes (``_DistributedBackendOptions``, ``pg_options``),
  replaces ``pg_options`` by ``ProcessGroupHCCL.Options()`` unless it is one, sets
  ``is_high_priority_stream = False``, ``_timeout``, ``global_ranks_in_group`` and
  ``group_id`` from the backend options, and returns ``ProcessGroupHCCL(store, group_rank,
  group_size, pg_options)``. `install` registers the same creator.
* ``ProcessGroupHCCL.Options`` (``torch_npu/csrc/distributed/Init.cpp``): a
  ``Backend.Options`` of backend ``"hccl"`` made with no arguments, with ``op_timeout``,
  ``is_high_priority_stream``, ``global_ranks_in_group``, ``hccl_config`` and ``group_id``
  (``ProcessGroupHCCL.hpp``, ``struct Options``); `ProcessGroupHCCL.Options` checks the types
  pybind11's ``def_readwrite`` would.
* The collectives vLLM's tensor-parallel path calls on the device group
  (``vllm/distributed/device_communicators/base_device_communicator.py`` of vLLM 0.30.0:
  ``dist.all_reduce``, ``dist.all_gather_into_tensor``, ``torch.distributed
  .reduce_scatter_tensor``, ``torch.distributed.broadcast``; vLLM-Ascend 0.30.0rc2's
  ``NPUCommunicator`` and 0.23.0.post1's add only ``all_to_all``, which the dense TP path does
  not call): ``ProcessGroupHCCL::allreduce`` and friends (``ProcessGroupHCCL.cpp``) check each
  tensor with ``check_npu_single_tensor`` / ``check_npu_tensors_different_devices``
  ("Tensors must be NPU and dense", "Tensors must be contiguous", one tensor per process:
  "Tensor list mustn't be larger than the number of available NPUs"), map the reduce op
  (``getHcclReduceOp``: SUM, PRODUCT, MIN, MAX; AVG is a SUM then a division by the group
  size; "Cannot use ReduceOp.BAND with HCCL" for BAND/BOR/BXOR), check the data type
  (``checkSupportedDataType``: int8, int16, int32, fp16, fp32, bf16, int64 for reductions;
  bool and uint8 are reduced as int32), then ``collective()`` makes the HCCL stream wait on
  the current stream of the tensor's device (``syncStreams``) and ``work.wait()`` makes the
  current stream wait on it. The twin queues the collective on that current stream itself,
  which orders it the same way for every caller that waits (``async_op=False``, and every
  ``work.wait()``).
* Capture: under a capture (``c10_npu::currentStreamCaptureStatusMayInitCtx``) the HCCL task
  joins the capturing graph through ``syncStreams``'s event and is re-run by every replay;
  here it is recorded into the graph like any device op and each replay runs the gloo
  collective again, with the group, the reduce op and the tensors frozen at capture. Every
  rank replays its own graph; a replay's collective runs when its rank's host synchronises
  (the twin runs device work then), so ranks meet in gloo whatever order their hosts reach
  the replay in.
* One device per communicator: torch_npu creates the HCCL communicator at the first
  collective, under a guard on the tensor's device, and caches it by device
  (``getHCCLComm(devicesKey)``, ``createHCCLComm``: ``npuGuard.set_index(devices[0])``).
  A later collective on a tensor of another device would make a second communicator there,
  a rendezvous the other ranks never join (on hardware: a hang until the connect timeout).
  The twin refuses that collective at the call with `CommunicatorDeviceError`, naming both
  devices (no CANN error code covers it; like `device.DeviceHang`, an error in place of a
  hang).

Not modelled: point-to-point, gather, scatter, all-to-all and coalesced collectives (they
raise `NotInTwinError`), ``PREMUL_SUM``, HCCL's own numerics (fp16 and bf16 are reduced in
fp32 and rounded once; with two ranks that is HCCL's result), a rank whose first collective is
already on the wrong device, and anything HCCL-specific beyond the names vLLM-Ascend's paths
we run call.
"""

from __future__ import annotations

import datetime
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from . import device as twin
from .npu_module import NotInTwinError, placeholder

_C10D = torch._C._distributed_c10d
_Red = dist.ReduceOp.RedOpType
#: the reduce ops HCCL has (``hcclOp`` of ProcessGroupHCCL.cpp), as torch ops on host memory
_GLOO_OP = {_Red.SUM: dist.ReduceOp.SUM, _Red.PRODUCT: dist.ReduceOp.PRODUCT,
            _Red.MIN: dist.ReduceOp.MIN, _Red.MAX: dist.ReduceOp.MAX,
            _Red.AVG: dist.ReduceOp.SUM}
_UNSUPPORTED_OP = {_Red.BAND: "BAND", _Red.BOR: "BOR", _Red.BXOR: "BXOR"}
#: ``checkSupportedDataType`` on an Atlas A2 (the 910B; A5 adds uint64 and fp64)
_REDUCIBLE = {torch.int8, torch.int16, torch.int32, torch.float16, torch.float32,
              torch.bfloat16, torch.int64}
#: reduced as int32 and cast back (the ``pre`` step of ``ProcessGroupHCCL::allreduce``)
_CAST_TO_INT = {torch.bool, torch.uint8}
#: gloo reduces these in fp32 here (rounded once to the tensor's dtype)
_WIDENED = {torch.float16, torch.bfloat16}

#: whether a communicator is bound to the device of its first collective (False restores the
#: behaviour without the check, for the test that shows what it prevents)
BINDS_DEVICE = True


class CommunicatorDeviceError(twin.TwinError):
    """A collective on a tensor of another device than the one this rank's communicator was
    created on (on hardware: a second communicator no other rank joins, a hang)."""


def _field(name: str) -> property:
    """An option read from ``_fields`` and written through ``_Options._set``'s type check."""
    return property(lambda self: self._fields[name],
                    lambda self, value: self._set(name, value))


class _Options(_C10D.Backend.Options):
    """``ProcessGroupHCCL.Options()``: backend ``"hccl"``; ``_timeout`` (inherited),
    ``op_timeout``, ``is_high_priority_stream``, ``global_ranks_in_group``, ``hccl_config``,
    ``group_id``, each type-checked as pybind11 would."""

    def __init__(self) -> None:
        super().__init__("hccl")
        self._fields: dict[str, Any] = {
            "op_timeout": datetime.timedelta(milliseconds=1_836_000),
            "is_high_priority_stream": False, "global_ranks_in_group": [],
            "hccl_config": {}, "group_id": ""}

    op_timeout = _field("op_timeout")
    is_high_priority_stream = _field("is_high_priority_stream")
    global_ranks_in_group = _field("global_ranks_in_group")
    hccl_config = _field("hccl_config")
    group_id = _field("group_id")

    def _set(self, name: str, value: Any) -> None:
        if name == "op_timeout":
            ok = isinstance(value, datetime.timedelta)
        elif name == "is_high_priority_stream":
            ok = isinstance(value, bool)
        elif name == "global_ranks_in_group":
            ok = isinstance(value, (list, tuple)) and all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value)
            value = list(value) if ok else value
        elif name == "hccl_config":
            ok = isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, (int, str)) for k, v in value.items())
        else:
            ok = isinstance(value, str)
        if not ok:
            raise TypeError(f"ProcessGroupHCCL.Options.{name}: incompatible value {value!r}")
        self._fields[name] = value


def _check_single(tensor: Any) -> torch.Tensor:
    """``check_npu_single_tensor`` (ProcessGroupHCCL.cpp)."""
    if not twin.is_npu_tensor(tensor):
        raise RuntimeError("Tensors must be NPU and dense")
    if not tensor.is_contiguous():
        raise RuntimeError("Tensors must be contiguous")
    return tensor


def _check_list(tensors: Any) -> torch.Tensor:
    """``check_npu_tensors_different_devices``: exactly one tensor per process."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise RuntimeError("Tensor list must be nonempty")
    if len(tensors) != 1:
        raise RuntimeError("Tensor list mustn't be larger than the number of available NPUs")
    return _check_single(tensors[0])


def _reduce_op(opts: Any, tensor: torch.Tensor, function: str) -> Any:
    op = opts.reduceOp.op
    if op in _UNSUPPORTED_OP:
        raise RuntimeError(f"Cannot use ReduceOp.{_UNSUPPORTED_OP[op]} with HCCL")
    if op not in _GLOO_OP:
        raise NotInTwinError(f"ReduceOp {op} is not modelled by the NPU twin's HCCL")
    if tensor.dtype not in _REDUCIBLE | _CAST_TO_INT:
        raise RuntimeError(f"HCCL {function}: Unsupported data type {tensor.dtype}")
    return op


def _done_work(tensors: list[torch.Tensor]) -> Any:
    """The ``Work`` handed back: the collective is queued on the current stream, so waiting
    on it is already ordered; a host that needs the values synchronises (``.cpu()``)."""
    future = torch.futures.Future()
    future.set_result(tensors)
    return _C10D._create_work_from_future(future)


class ProcessGroupHCCL(dist.ProcessGroup):
    """``torch_npu._C._distributed_c10d.ProcessGroupHCCL(store, rank, size, options)`` (or
    ``(store, rank, size, timeout)``) on the twin: a process group whose collectives take
    contiguous npu tensors of one device and run over a gloo group on their host memory,
    queued on the current stream of the tensors' device (recorded into a capturing graph and
    re-run by each replay).

    Example (two processes, rank r on npu:r)::

        torch.npu.set_device(rank)
        dist.init_process_group("hccl", init_method="file:///tmp/f", rank=rank, world_size=2)
        x = torch.ones(4, device="npu")        # float32 [4]
        dist.all_reduce(x)                     # queued; x.cpu() == [2., 2., 2., 2.]
    """

    Options = _Options

    def __init__(self, store: Any, rank: int, size: int, options: Any = None) -> None:
        super().__init__(rank, size)
        if isinstance(options, datetime.timedelta):
            timeout, options = options, _Options()
            options._timeout = timeout
        elif options is None:
            options = _Options()
        elif not isinstance(options, _Options):
            raise TypeError("ProcessGroupHCCL: options must be ProcessGroupHCCL.Options or a "
                            f"timeout, got {type(options).__name__}")
        self._options = options
        self._gloo = dist.ProcessGroupGloo(_C10D.PrefixStore("npu-twin-hccl/", store), rank,
                                           size, options._timeout)
        #: the device of this rank's communicator, from its first collective
        self.device_index: int | None = None
        #: collectives run on the device (eager and replayed), for tests and counters
        self.collectives_run = 0

    @property
    def options(self) -> _Options:
        return self._options

    def getBackendName(self) -> str:
        return "hccl"

    def name(self) -> str:
        return "hccl"

    # torch_npu's ProcessGroupHCCL is a ``c10d::Backend`` (``ProcessGroupHCCL.hpp``: ``class
    # ProcessGroupHCCL : public c10d::Backend``) that torch registers on the ProcessGroup it
    # makes, and ``ProcessGroup::getGroupName`` (torch ``csrc/distributed/c10d/
    # ProcessGroup.hpp``) returns the name ``_set_group_name`` gave that backend. A Python
    # ProcessGroup like this one has no backend registered, so torch's own getter raises
    # "ProcessGroup name not set", and ``dist.destroy_process_group(group)`` (vLLM-Ascend
    # 0.30.0rc2 ``patch/worker/patch_distributed.py`` ``_release_hccl_resources``, at every
    # worker's shutdown) stops there; the name and description are kept here instead.
    _twin_group_name: str | None = None
    _twin_group_desc: str | None = None

    def _set_group_name(self, name: str) -> None:
        self._twin_group_name = name

    @property
    def group_name(self) -> str:
        if self._twin_group_name is None:
            raise RuntimeError("ProcessGroup name not set")  # torch's TORCH_CHECK text
        return self._twin_group_name

    def _set_group_desc(self, desc: str) -> None:
        self._twin_group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._twin_group_desc or "undefined"

    def _get_backend(self, device: Any) -> ProcessGroupHCCL:
        if torch.device(device).type != "npu":
            raise RuntimeError(f"No backend type associated with device type "
                               f"{torch.device(device).type}")
        return self

    # ---- queueing ----------------------------------------------------------------------------
    def _queue(self, label: str, tensors: list[torch.Tensor], body) -> Any:
        """Queue `body` (a gloo call on host memory) as one device task on the current stream
        of the tensors' device; the group is bound to the device of its first collective."""
        dev = twin.device()
        dev.check_alive()
        index = twin.index_of(tensors[0])
        for other in tensors[1:]:
            if twin.index_of(other) != index:
                raise RuntimeError("Tensors must be on same NPU device")
        if self.device_index is None:
            self.device_index = index
        elif BINDS_DEVICE and index != self.device_index:
            raise CommunicatorDeviceError(
                f"ProcessGroupHCCL.{label} on rank {self.rank()}: the tensor is on npu:{index}, "
                f"but this rank's HCCL communicator was created on npu:{self.device_index} "
                "(torch_npu makes one per device at its first collective; a second one on "
                f"npu:{index} is a rendezvous no other rank joins: a hang on hardware)")
        dev.ensure_context(index)

        def run() -> None:
            body()
            self.collectives_run += 1
            # per process, eager and replayed alike (the queued count is stats["hccl"]): the
            # engine check tells a replay's collectives from the ones issued by the host
            dev.stats["collectives_run"] += 1
        dev.enqueue(twin.Work("hccl", f"HCCL {label}", run), dev.current_stream(index))
        return _done_work(list(tensors))

    def _allreduce_host(self, host: torch.Tensor, op: Any) -> None:
        """All-reduce `host` (a host tensor, written in place) over gloo with HCCL's rules."""
        wide = host.to(torch.int32) if host.dtype in _CAST_TO_INT else \
            host.to(torch.float32) if host.dtype in _WIDENED else host
        opts = _C10D.AllreduceOptions()
        opts.reduceOp = _GLOO_OP[op]
        self._gloo.allreduce([wide], opts).wait()
        if op == _Red.AVG:
            wide = wide.div_(self.size()) if wide.is_floating_point() else \
                wide.div_(self.size(), rounding_mode="trunc")
        if wide is not host:
            host.copy_(wide)

    # ---- collectives -------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """``dist.all_reduce``: one npu tensor, reduced in place."""
        tensor = _check_list(tensors)
        opts = opts if opts is not None else _C10D.AllreduceOptions()
        op = _reduce_op(opts, tensor, "allreduce")
        host = twin.inner(tensor)
        return self._queue("allreduce", [tensor], lambda: self._allreduce_host(host, op))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """``dist.broadcast``: `opts.rootRank`'s tensor into every rank's."""
        tensor = _check_list(tensors)
        opts = opts if opts is not None else _C10D.BroadcastOptions()
        root, host = opts.rootRank, twin.inner(tensor)
        if not 0 <= root < self.size():
            raise ValueError(f"broadcast: invalid root rank {root} for a group of {self.size()}")

        def body() -> None:
            gloo_opts = _C10D.BroadcastOptions()
            gloo_opts.rootRank = root
            self._gloo.broadcast([host], gloo_opts).wait()
        return self._queue("broadcast", [tensor], body)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Any:
        """``dist.all_gather_into_tensor``: `output` ([size * n, ...] or [size, n, ...]) holds
        every rank's `input` ([n, ...]) in rank order."""
        out, inp = _check_single(output), _check_single(input)
        if out.dtype != inp.dtype or out.numel() != inp.numel() * self.size():
            raise ValueError("all_gather_into_tensor: output tensor size must be equal to "
                             "world_size times input tensor size, of the input's dtype")
        out_host, in_host = twin.inner(out), twin.inner(inp)

        def body() -> None:
            parts = list(out_host.view(-1).chunk(self.size()))
            self._gloo.allgather([parts], [in_host.reshape(-1)]).wait()
        return self._queue("all_gather_into_tensor", [out, inp], body)

    _allgather_base = all_gather_single

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list,
                  opts: Any = None) -> Any:
        """``dist.all_gather``: a list of `size` npu tensors, each the input's shape."""
        inp = _check_list(input_tensors)
        if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
            raise ValueError(f"all_gather: expected one list of {self.size()} output tensors")
        outs = [_check_single(t) for t in output_tensors[0]]
        if any(t.shape != inp.shape or t.dtype != inp.dtype for t in outs):
            raise ValueError("all_gather: every output tensor must have the input's shape and "
                             "dtype")
        out_hosts, in_host = [twin.inner(t) for t in outs], twin.inner(inp)
        return self._queue("allgather", [inp, *outs],
                           lambda: self._gloo.allgather([out_hosts], [in_host]).wait())

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Any:
        """``dist.reduce_scatter_tensor``: `output` ([n, ...]) is this rank's chunk of the
        reduction of every rank's `input` ([size * n, ...])."""
        out, inp = _check_single(output), _check_single(input)
        if out.dtype != inp.dtype or inp.numel() != out.numel() * self.size():
            raise ValueError("reduce_scatter_tensor: input tensor size must be equal to "
                             "world_size times output tensor size, of the output's dtype")
        opts = opts if opts is not None else _C10D.ReduceScatterOptions()
        op = _reduce_op(opts, inp, "reduce_scatter")
        out_host, in_host, rank = twin.inner(out), twin.inner(inp), self.rank()

        def body() -> None:
            reduced = in_host.reshape(-1).clone()
            self._allreduce_host(reduced, op)
            out_host.view(-1).copy_(reduced.chunk(self.size())[rank])
        return self._queue("reduce_scatter_tensor", [out, inp], body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors: list, input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        """``dist.reduce_scatter``: the reduction of every rank's `input_tensors[0][rank]`."""
        out = _check_list(output_tensors)
        if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
            raise ValueError(f"reduce_scatter: expected one list of {self.size()} inputs")
        ins = [_check_single(t) for t in input_tensors[0]]
        if any(t.shape != out.shape or t.dtype != out.dtype for t in ins):
            raise ValueError("reduce_scatter: every input must have the output's shape and "
                             "dtype")
        opts = opts if opts is not None else _C10D.ReduceScatterOptions()
        op = _reduce_op(opts, out, "reduce_scatter")
        out_host, in_hosts, rank = twin.inner(out), [twin.inner(t) for t in ins], self.rank()

        def body() -> None:
            reduced = torch.stack(in_hosts)
            self._allreduce_host(reduced, op)
            out_host.copy_(reduced[rank])
        return self._queue("reduce_scatter", [out, *ins], body)

    def barrier(self, opts: Any = None) -> Any:
        """``dist.barrier``: torch_npu all-reduces a one-element tensor on the rank's device
        and waits for it (``ProcessGroupHCCL::barrier``); here a gloo barrier queued on that
        device's current stream, which the host then drains."""
        dev = twin.device()
        index = self.device_index if self.device_index is not None else dev.current_device()
        marker = torch.zeros(1, device=f"npu:{index}")
        self._queue("barrier", [marker], lambda: self._gloo.barrier().wait())
        dev.synchronize_stream(dev.current_stream(index), "ProcessGroupHCCL.barrier()")
        return _done_work([])

    def __repr__(self) -> str:
        return (f"<ProcessGroupHCCL (npu-twin) rank {self.rank()} of {self.size()}, "
                f"npu:{self.device_index}>")


for _name in ("send", "recv", "recv_anysource", "gather", "scatter", "reduce", "alltoall",
              "alltoall_base", "all_to_all_single", "allreduce_coalesced",
              "allgather_coalesced", "allgather_into_tensor_coalesced",
              "reduce_scatter_tensor_coalesced", "all_gather_single_coalesced",
              "reduce_scatter_single_coalesced", "get_hccl_comm_name", "get_hccl_comm",
              "batch_isend_irecv"):
    setattr(ProcessGroupHCCL, _name, staticmethod(placeholder(f"ProcessGroupHCCL.{_name}")))


def _new_process_group_hccl(dist_backend_opts: Any, pg_options: Any) -> ProcessGroupHCCL:
    """``_new_process_group_hccl_helper`` of ``torch_npu/_init/registry/distributed.py``."""
    if pg_options is None or not isinstance(pg_options, _Options):
        pg_options = _Options()
    pg_options.is_high_priority_stream = False
    pg_options._timeout = dist_backend_opts.timeout
    pg_options.global_ranks_in_group = list(dist_backend_opts.global_ranks_in_group)
    pg_options.group_id = dist_backend_opts.group_id
    return ProcessGroupHCCL(dist_backend_opts.store, dist_backend_opts.group_rank,
                            dist_backend_opts.group_size, pg_options)


def is_hccl_available() -> bool:
    """torch_npu's ``torch.distributed.is_hccl_available``: whether ``hccl`` is a registered
    backend (``distributed/distributed_c10d.py``)."""
    return "hccl" in dist.Backend.backend_list


def c10d_module(make_module: Callable[[str], types.ModuleType]) -> types.ModuleType:
    """``torch_npu._C._distributed_c10d``: `ProcessGroupHCCL`; other names raise
    `NotInTwinError` when called (`make_module`: torch_npu_module's module factory, passed in
    so that this module does not import the one that imports it)."""
    module = make_module("torch_npu._C._distributed_c10d")
    module.ProcessGroupHCCL = ProcessGroupHCCL
    return module


def install() -> None:
    """Register the ``hccl`` backend with ``torch.distributed`` (as ``import torch_npu``
    does), when torch has distributed support."""
    if dist.is_available() and dist.is_gloo_available():
        dist.Backend.register_backend("hccl", _new_process_group_hccl, extended_api=True,
                                      devices=["npu"])
        # torch_npu 2.10.0.post4 ``_init/patches/distributed_patches.py`` sets
        # ``torch.distributed.is_hccl_available`` to ``distributed/distributed_c10d.py``'s
        # ``is_hccl_available``: ``"hccl" in Backend.backend_list`` (vLLM-Ascend 0.23's
        # netloader imports the name from ``torch.distributed`` at plugin load)
        dist.is_hccl_available = is_hccl_available
