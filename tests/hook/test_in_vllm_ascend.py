"""The hook inside vLLM-Ascend's own code, oldest and newest supported release (issue 17).

Each release runs in its own environment made by ``tools/vllm_env.sh`` (vLLM built from its
sdist with ``VLLM_TARGET_DEVICE=empty``, the release's real source tree; ``.ci/run`` builds
both, cached under ``~/.cache/aicpu-tiling/vllm-envs``). There:

* ``aicpu-tiling hook-dryrun --json``: vLLM-Ascend's own ``AscendAttentionMetadataBuilder``,
  ``AscendAttentionBackendImpl`` and ``ACLGraphWrapper`` capture and replay a small decoder
  on the NPU twin, without and with the hook (the real engine, the AI-CPU tiling kernel in
  the AArch64 emulator): every layer moves and is no longer updated (the soft-capped one
  too, with its cap applied; the gpt-oss-shaped layer with attention sinks, which
  vLLM-Ascend captures through ``full_graph_fia_v2``, with its sinks applied; the
  sliding-window layer with the model's W keys), and every output matches float64. With an
  engine that drops the sinks the dry run fails; with one that does not apply windows the
  windowed layer keeps vLLM-Ascend's path and its update in the same graph. The KV caches are
  allocated as each release's model runner does: on 0.30.0rc2 the full-attention and C8
  layers' K and V pages side by side in one allocation (page-strided views, read in place by
  vLLM-Ascend's FIA on the twin and by our kernels), contiguous on 0.23.0.post1 and for
  sliding-window layers (each layer's ``kv_cache`` in the report).
* ``--model gpt-oss|gemma2|gemma3``: layer sets from the real configs (windows 128 / 4096 /
  1024, sinks, soft cap 50), every layer on the device path, kv lengths past the window, one
  tiling per distinct window planned by one AI-CPU launch per step, zero host updates. With
  an engine that drops the window the dry run fails.
* ``aicpu-tiling hook-dryrun --model mla`` (and ``python -m pyruntime.hook.dryrun --model
  mla``): vLLM-Ascend's own ``AscendMLAImpl`` at one TP-8 rank of DeepSeek-V3 captured on the
  device path, zero task updates, against float64 absorbed MLA; a mixed graph (an NZ-cache layer on
  vLLM-Ascend's path, updated once a step); 20 heads (padded); the Triton MLA bodies; an
  engine that drops the rope part is caught; the patch installs and uninstalls exactly.
* ``aicpu-tiling hook-dryrun --model plain --captured-sizes N`` (N = 1, 8, 32): the blocking
  copies and synchronizes per replayed step in vLLM-Ascend's classes, counted by the twin,
  are the same with the hook as without it (issue 30).
* ``tools/run_vllm_ascend_ut.py --both``: vLLM-Ascend's own unit tests of the classes we
  patch (``test_mla_v1.py`` included), without and with the hook applied: no outcome differs.

Without an environment the tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheels import vllm_env as _env

REPO = Path(__file__).resolve().parents[2]
#: the oldest and the newest supported release
RELEASES = ("0.23.0.post1", "0.30.0rc2")


def kv_cache_layouts(release: str, shape: tuple, strided_layers: list[bool]) -> list[dict]:
    """Each layer's ``kv_cache`` entry of a report, as the release's model runner allocates
    the caches (``pyruntime/hook/dryrun/kv_caches.py``): on 0.30.0rc2 a layer of
    `strided_layers` has K and V views of one allocation, the pages side by side (page stride
    twice a block's elements, V one block after K); every other layer, and every layer on
    0.23.0.post1, two contiguous allocations. `shape`: ``[num_blocks, block_size, H, D]``."""
    _, block_size, heads, dim = shape
    hidden = block_size * heads * dim
    strided = {"shape": list(shape), "stride": [2 * hidden, heads * dim, dim, 1],
               "one_allocation": True, "value_offset": hidden, "contiguous": False}
    contiguous = {"shape": list(shape), "stride": [hidden, heads * dim, dim, 1],
                  "one_allocation": False, "value_offset": None, "contiguous": True}
    return [strided if release == RELEASES[1] and s else contiguous for s in strided_layers]


def _clean_env(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AICPU_TILING", "AICPU_TILING_ENGINE", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tree)])
    return env


#: (release, placement, speculative tokens): each release under both placements, decode
#: (q_len 1) and MTP verification (q_len 2)
DRYRUNS = [(RELEASES[0], "graph", 0), (RELEASES[0], "pre-replay", 1),
           (RELEASES[1], "graph", 1), (RELEASES[1], "pre-replay", 0)]
#: two runs that between them still cover both releases, both placements and q_len 1 and 2:
#: for the layer sets other than the mixed one, whose every run costs 20-40 s of CI
#: (docs/hook-variants.md and docs/hook-int8.md have each set on all four DRYRUNS)
PAIR = [DRYRUNS[0], DRYRUNS[3]]
#: the other two, for a second set of runs to cover the pairs PAIR does not
OTHER_PAIR = [DRYRUNS[1], DRYRUNS[2]]


@pytest.mark.parametrize("release, placement, spec_tokens", DRYRUNS)
def test_hook_dryrun_in_vllm_ascends_own_classes(release, placement, spec_tokens):
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.cli", "hook-dryrun", "--json",
                           "--placement", placement, "--spec-tokens", str(spec_tokens)],
                          capture_output=True, text=True, env=_clean_env(tree), cwd=REPO,
                          timeout=600, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout[start:])
    assert report["schema"] == "aicpu-tiling/hook-dryrun"
    assert report["vllm_ascend"] == release and report["device"] == "npu-twin"
    assert report["placement"] == placement and report["spec_tokens"] == spec_tokens
    # every layer takes the device path; layer 1 has a sliding window of 24 (its error below
    # is against the model's W keys, and the window bit on some steps)
    assert [layer["path"] for layer in report["layers"]] == ["device"] * 5, report["layers"]
    assert [layer["sliding_window"] for layer in report["layers"]] == [None, 24, None, None,
                                                                       None]
    assert report["layers"][1]["steps_past_window"] > 0
    assert report["layers"][1]["window_distance"] > 100 * report["tolerance"]
    # layer 2 has a logits soft cap of 2.0, which vLLM-Ascend's path ignores: on the device
    # path it is applied, and the error below is against the capped float64 reference (an
    # engine that dropped the cap would be far outside the tolerance)
    assert [layer["logits_soft_cap"] for layer in report["layers"]] == [None, None, 2.0, None,
                                                                        None]
    # layer 4 is a gpt-oss full layer (64 q heads, 8 kv heads, head_dim 64, float32 sinks):
    # vLLM-Ascend sends it to full_graph_fia_v2, which the hook captures on the device path;
    # its error below is against the float64 reference with the sinks, and the answer
    # without them is far outside the tolerance at every step
    assert [layer["sinks"] for layer in report["layers"]] == [False] * 4 + [True]
    assert [layer["entry"] for layer in report["layers"]] == ["full_graph_fia"] * 4 + [
        "full_graph_fia_v2"]
    sink_layer = report["layers"][4]
    assert sink_layer["max_rel_err"] <= report["tolerance"]
    assert sink_layer["sinks_distance"] > 100 * report["tolerance"]
    # the tilings split units over cores on some steps, so the combine added the sinks of
    # those rows (the other rows got theirs where a whole unit normalises its row)
    assert 0 < report["steps_with_split_units"] <= report["steps"]
    # vLLM-Ascend updates every FIA layer it runs; without the hook it runs the sink layer
    # (FIA v2, modelled by the twin) on 0.30, not on 0.23, whose update takes a graph's FIAs
    # all as v2 or all as v1 (a graph mixing both cannot be host-updated there)
    assert report["updates_per_step_before"] == (4 if release == RELEASES[0] else 5)
    assert report["updates_per_step_after"] == 0  # none of the device-path layers
    assert [layer["updates_per_step"] for layer in report["layers"]] == [0] * 5
    assert report["updates_per_step_host_layers"] == 0
    # one graph, two windows (none and 24): two tilings, one AI-CPU launch per step
    assert report["tilings_per_graph"] == 2 and report["tiling_launches_per_step"] == 1
    assert report["max_rel_err"] <= report["tolerance"] == 1e-4
    assert report["max_rel_err_before"] <= 1e-4  # its own path is right on the twin too
    # the caches as the release's runner allocates them: on 0.30.0rc2 the full-attention
    # layers' (plain, soft-capped, sinks) K and V pages side by side in one allocation, read
    # in place by vLLM-Ascend's FIA (without the hook) and by our kernels (with it), both
    # within the tolerance above; the windowed layer's (SlidingWindowSpec) contiguous
    assert [layer["kv_cache"] for layer in report["layers"]] == kv_cache_layouts(
        release, (96, 16, 8, 64), [True, False, True, True, True])
    assert report["ok"] and proc.returncode == 0


@pytest.mark.parametrize("release", RELEASES[1:])
def test_a_dropped_sink_is_caught(release):
    """The same hooked run with an engine that drops every layer's sinks (while declaring
    applies_sinks): the sink layer still takes the device path, and the dry run sees it
    outside the tolerance, by about the distance of the sinkless answer."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    environ = _clean_env(tree)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(REPO / "tests" / "hook")])
    environ["AICPU_TILING_ENGINE"] = "dryrun_sinkless_engine:make"
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--placement", "graph",
                           "--steps", "3"], capture_output=True, text=True, env=environ,
                          cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    run = json.loads(lines[-1])
    sink_layer = run["layers"][4]
    assert sink_layer["sinks"] and sink_layer["path"] == "device"
    assert sink_layer["entry"] == "full_graph_fia_v2"
    assert sink_layer["max_rel_err"] > 100 * 1e-4
    assert sink_layer["max_rel_err"] >= 0.99 * sink_layer["sinks_distance"]
    assert all(layer["max_rel_err"] <= 1e-4 for layer in run["layers"][:4])


#: captured graph counts and the placement each runs under: both placements, each count once
#: (every case is two children, the run without the hook and the run with it: 30-100 s)
CAPTURED_SIZES = [(1, "pre-replay"), (8, "graph"), (32, "pre-replay")]


@pytest.mark.parametrize("captured, placement", CAPTURED_SIZES)
def test_the_hook_adds_no_blocking_copy_and_no_synchronize_per_step(captured, placement):
    """Issue 30: vLLM-Ascend's own classes capture `captured` graphs (token buckets 1..N) on
    the twin, without the hook and with it; per replayed step, the blocking host-to-device
    and device-to-host copies and the synchronizes the host makes in the model runner's part
    (the replay through ACLGraphWrapper, the hook's before_replay inside it, vLLM-Ascend's
    update after it) are counted by the twin (torch_npu's copy_between_host_and_device
    rule). The hook adds none, whatever the number of graphs: before issue 30 its
    before_replay made one blocking epoch copy per captured graph per step. The bench's
    device mode of the same placement and key count makes the same host waits per measured
    step (its per-step invariants row): the tie between the bench and the twin."""
    env = _env(RELEASES[1])
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.cli", "hook-dryrun", "--json",
                           "--model", "plain", "--captured-sizes", str(captured),
                           "--placement", placement, "--steps", "2"],
                          capture_output=True, text=True, env=_clean_env(tree), cwd=REPO,
                          timeout=600, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout[start:])
    assert report["captured_sizes"] == captured and report["device"] == "npu-twin"
    assert [layer["path"] for layer in report["layers"]] == ["device"] * 2
    before, after = report["host_waits_per_step_before"], report["host_waits_per_step_after"]
    added = {k: after[k] - before[k] for k in before}
    assert added == {"copies_h2d_blocking": 0, "copies_d2h": 0, "synchronizes": 0}, (
        before, after)
    # what both runs keep: vLLM-Ascend's own synchronize before each replay
    assert before["synchronizes"] >= 1
    assert report["ok"] and proc.returncode == 0
    # the bench's device mode of this placement, with the engine's work for as many keys,
    # waits per measured step exactly as the twin counted vLLM-Ascend's classes with the hook
    bench = _bench_serving_row(placement, captured)
    assert {k: bench[k] for k in ("copies_h2d_blocking", "synchronizes")} == {
        k: after[k] for k in ("copies_h2d_blocking", "synchronizes")}, (bench, after)
    assert after["copies_d2h"] == 0  # the bench's step reads nothing back either


def _bench_serving_row(placement: str, graph_keys: int) -> dict:
    """The bench's per-step invariants row (one layer) of the device mode of `placement` under
    the symmetric method: its whole measured serving step with the hook engine's work for
    `graph_keys` keys (`pyruntime.measurement.invariants`, on the CPU backend)."""
    from pyruntime.hook.engine_step import engine_step_work
    from pyruntime.measurement import invariants as inv
    from pyruntime.measurement.abrun import Geometry
    from pyruntime.measurement.serving import EngineWork

    mode = "device_tiling" if placement == "graph" else "pre_replay"
    c = engine_step_work(placement, graph_keys)
    work = EngineWork(graph_keys, c.h2d_copies, c.blocking_copies, c.tiling_launches,
                      c.device_ops)
    rows = inv.measure(Geometry(max_kv=256), layers=(1,), modes=(mode,), batch=8, warmup=1,
                       method="symmetric", engine={mode: work})
    return rows[mode]["1"]


#: per real-config set: each layer's window, the soft cap of every layer, each layer's sinks
MODEL_SETS = {
    # vLLM gpt_oss.py: window on even layers, sinks on every layer; GptOssConfig window 128
    "gpt-oss": ([128, None, 128, None], None, [True] * 4),
    # Gemma2Config: window 4096 on even layers, attn_logit_softcapping 50 on every layer
    "gemma2": ([4096, None], 50.0, [False] * 2),
    # Gemma3TextConfig pattern 6: sliding unless (i + 1) % 6 == 0; window 1024 (gemma-3-4b/12b)
    "gemma3": ([1024] * 5 + [None], None, [False] * 6),
}


#: each set on two runs that between them cover both releases, both placements and q_len 1
#: and 2 (each run is about 40 s; docs/hook-variants.md has all twelve)
MODEL_RUNS = ([("gpt-oss", *run) for run in OTHER_PAIR]
              + [("gemma2", *DRYRUNS[0]), ("gemma2", RELEASES[1], "pre-replay", 1),
                 ("gemma3", *DRYRUNS[1]), ("gemma3", RELEASES[1], "graph", 0)])


@pytest.mark.parametrize("model, release, placement, spec_tokens", MODEL_RUNS)
def test_real_config_layer_sets_run_wholly_on_the_device_path(model, release, placement,
                                                              spec_tokens):
    """gpt-oss / Gemma 2 / Gemma 3-shaped layer sets: every layer captured on the device path
    (the windowed ones included), zero host updates per step, the windows biting (kv past the
    window on some steps, and the answer without the window far off), one tiling per distinct
    window planned by one AI-CPU launch per step, and every output within the tolerance of
    float64 with the model's W keys."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.cli", "hook-dryrun", "--json",
                           "--model", model, "--placement", placement, "--spec-tokens",
                           str(spec_tokens), "--steps", "4"],
                          capture_output=True, text=True, env=_clean_env(tree), cwd=REPO,
                          timeout=600, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout[start:])
    windows, cap, sinks = MODEL_SETS[model]
    layers = report["layers"]
    assert report["model"] == model and report["vllm_ascend"] == release
    assert report["placement"] == placement and report["spec_tokens"] == spec_tokens
    assert [layer["path"] for layer in layers] == ["device"] * len(windows), layers
    assert [layer["sliding_window"] for layer in layers] == windows
    assert [layer["logits_soft_cap"] for layer in layers] == [cap] * len(windows)
    assert [layer["sinks"] for layer in layers] == sinks
    assert [layer["updates_per_step"] for layer in layers] == [0] * len(windows)
    assert report["updates_per_step_after"] == 0 == report["updates_per_step_host_layers"]
    # without the hook vLLM-Ascend's own path ran every layer (gpt-oss's through FIA v2 with
    # learnable_sink, on the twin), updated once per layer per step, FIA's W + 1 band and no
    # soft cap in its reference
    assert report["updates_per_step_before"] == len(windows)
    assert report["max_rel_err_before"] <= report["tolerance"]
    for layer in layers:
        assert layer["max_rel_err"] <= report["tolerance"] == 1e-4, layer
        if layer["sliding_window"] is not None:  # the window bit, and mattered
            assert 0 < layer["steps_past_window"] <= report["steps"], layer
            assert layer["window_distance"] > 100 * report["tolerance"], layer
    assert report["tilings_per_graph"] == 2 and report["tiling_launches_per_step"] == 1
    assert report["ok"] and proc.returncode == 0


def _dryrun_with_engine(release: str, factory: str, model: str) -> dict:
    """A hooked dry run (graph placement, 3 steps) with the engine ``factory`` names: a
    callable of ``dryrun_windowless_engine``, or ``module:callable`` of tests/hook."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    environ = _clean_env(tree)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(REPO / "tests" / "hook")])
    environ["AICPU_TILING_ENGINE"] = (factory if ":" in factory
                                      else f"dryrun_windowless_engine:{factory}")
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--placement", "graph",
                           "--steps", "3", "--model", model], capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("release", RELEASES[:1])
def test_a_dropped_window_is_caught(release):
    """The gpt-oss set with an engine that drops every layer's window (while declaring
    applies_sliding_window): the windowed layers still take the device path, and the dry run
    sees them outside the tolerance, by about the distance of the unwindowed answer."""
    run = _dryrun_with_engine(release, "make", "gpt-oss")
    for layer in run["layers"]:
        assert layer["path"] == "device"
        if layer["sliding_window"] is None:
            assert layer["max_rel_err"] <= 1e-4
        else:
            assert layer["max_rel_err"] > 100 * 1e-4
            assert layer["max_rel_err"] >= 0.99 * layer["window_distance"]


@pytest.mark.parametrize("release", RELEASES[1:])
def test_windows_an_engine_does_not_apply_keep_vllm_ascends_path_in_a_mixed_graph(release):
    """The mixed set with an engine without applies_sliding_window: the windowed layer keeps
    vLLM-Ascend's path (FIA's W + 1 keys, its reference) and its update, in a graph whose
    other layers are device-tiled and not updated."""
    run = _dryrun_with_engine(release, "make_host_windows", "mixed")
    assert [layer["path"] for layer in run["layers"]] == ["device", "host", "device", "device",
                                                          "device"]
    assert "no applies_sliding_window" in run["layers"][1]["reason"]
    assert [layer["updates_per_step"] for layer in run["layers"]] == [0, 1, 0, 0, 0]
    assert run["max_rel_err"] <= 1e-4


@pytest.mark.parametrize("release, placement, spec_tokens", PAIR)
def test_c8_layers_read_their_int8_nz_caches_in_place(release, placement, spec_tokens):
    """``hook-dryrun --model c8``: Qwen3-32B's attention geometry (64 / 8 heads, head_dim 128,
    block 128) with vLLM-Ascend's C8 int8 KV cache on every layer: its own
    ``AscendC8AttentionBackendImpl`` (built as ``kv_c8.create_weights`` swaps it in, with a
    C8 quant config; bfloat16, 64 / 8 heads, a shape FIA's int8 NZ path documents) captures
    through the patched ``full_graph_fia``, our kernels read the
    layer's int8 caches in place in the NZ layout vLLM-Ascend keeps them in, with its scales;
    zero host updates; every output against float64 over the dequantised caches, and the
    answer read without the scales far off."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.cli", "hook-dryrun", "--json",
                           "--model", "c8", "--placement", placement, "--spec-tokens",
                           str(spec_tokens), "--steps", "3"],
                          capture_output=True, text=True, env=_clean_env(tree), cwd=REPO,
                          timeout=600, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout[start:])
    layers = report["layers"]
    assert report["model"] == "c8" and report["vllm_ascend"] == release
    assert report["placement"] == placement and report["spec_tokens"] == spec_tokens
    assert [layer["path"] for layer in layers] == ["device"] * 3, layers
    assert [layer["kv_cache_dtype"] for layer in layers] == ["int8"] * 3
    assert [layer["entry"] for layer in layers] == ["full_graph_fia"] * 3
    assert [layer["updates_per_step"] for layer in layers] == [0] * 3
    assert report["updates_per_step_after"] == 0 == report["updates_per_step_host_layers"]
    assert report["dtype"] == "bfloat16" and report["tolerance"] == 1e-2
    for layer in layers:
        assert layer["max_rel_err"] <= report["tolerance"], layer
        assert layer["scales_distance"] > 100 * report["tolerance"], layer
    assert report["tilings_per_graph"] == 1 and report["tiling_launches_per_step"] == 1
    if spec_tokens == 0:
        # without the hook vLLM-Ascend's own C8 FIA call ran on the twin (int8 NZ caches, BNSD,
        # antiquant), updated once per layer per step, as close to float64 as ours
        assert report["updates_per_step_before"] == 3
        assert report["max_rel_err_before"] <= report["tolerance"]
    else:  # its C8 call cannot take q_len > 1 (pyruntime/hook/dryrun/models.py): not run there
        assert report["updates_per_step_before"] == 0
    # on 0.30.0rc2 every C8 layer's int8 K and V pages side by side in one allocation (a C8
    # layer's spec is FullAttentionSpec), its NZ view keeping that page stride
    assert [layer["kv_cache"] for layer in layers] == kv_cache_layouts(
        release, (40, 128, 8, 128), [True] * 3)
    assert report["ok"] and proc.returncode == 0


@pytest.mark.parametrize("release", RELEASES[1:])
def test_an_engine_that_drops_the_c8_scales_is_caught(release):
    """The C8 set with an engine that hands our kernels unit scales: the layers still take
    the device path, and the dry run sees each one off by about its scale-less distance."""
    run = _dryrun_with_engine(release, "dryrun_c8_engine:make_unscaled", "c8")
    for layer in run["layers"]:
        assert layer["path"] == "device"
        assert layer["max_rel_err"] > 100 * run["tolerance"]
        assert layer["max_rel_err"] >= 0.99 * layer["scales_distance"]


@pytest.mark.parametrize("release", RELEASES)
def test_vllm_ascends_own_unit_tests_pass_alike_with_the_hook(release, tmp_path):
    _env(release)
    out = tmp_path / "ut.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "run_vllm_ascend_ut.py"),
                           "--release", release, "--both", "--no-build", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert out.is_file(), proc.stderr[-2000:]
    report = json.loads(out.read_text())
    hooked = report["with_hook"]
    assert hooked["hook"]["state"] == "active", hooked["hook"]
    assert report["without_hook"]["counts"]["passed"] > 0
    assert report["differences"] == [], report["differences"]


@pytest.mark.parametrize("release, placement, spec_tokens", PAIR)
def test_mla_dryrun_in_vllm_ascends_own_mla_impl(release, placement, spec_tokens):
    """``hook-dryrun --model mla``: vLLM-Ascend's own ``AscendMLAImpl._forward_decode`` (and
    ``_v_up_proj``) at one TP-8 rank of DeepSeek-V3 (16 heads, 512 + 64) captured on the device
    path, replayed with trace batches, zero task updates, against float64 absorbed MLA."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.cli", "hook-dryrun", "--model", "mla",
                           "--json", "--placement", placement, "--steps", "3",
                           "--spec-tokens", str(spec_tokens)],
                          capture_output=True, text=True, env=_clean_env(tree), cwd=REPO,
                          timeout=600, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout[start:])
    assert report["schema"] == "aicpu-tiling/hook-dryrun-mla"
    assert report["vllm_ascend"] == release and report["device"] == "npu-twin"
    assert report["placement"] == placement and report["spec_tokens"] == spec_tokens
    assert [layer["path"] for layer in report["layers"]] == ["device"] * 3, report["layers"]
    assert [layer["entry"] for layer in report["layers"]] == ["_forward_decode"] * 3
    assert report["updates_per_step_after"] == 0
    # the MLA update_graph_params ran after every replay and was skipped each time
    assert report["updates_skipped"] == report["steps"] == 3
    assert 0 < report["steps_with_split_units"] <= report["steps"]
    assert report["max_rel_err"] <= report["tolerance"] == 1e-4
    # dropping the rope part of the scores would be far outside the tolerance
    assert report["rope_distance"] > 100 * report["tolerance"]
    assert report["ok"] and proc.returncode == 0


@pytest.mark.parametrize("release", RELEASES[:1])
def test_an_mla_engine_that_drops_the_rope_is_caught(release):
    """The same MLA run with an engine that hands our kernels a zero ``q_pe``: the layers still
    take the device path, and the dry run fails, off by about the distance of the rope-less
    answer."""
    from pyruntime.hook.dryrun import mla as dryrun_mla

    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    environ = _clean_env(tree)
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--model", "mla",
                           "--steps", "2",
                           "--fault", "drop-rope"], capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert [layer["path"] for layer in report["layers"]] == ["device"] * 3
    assert report["max_rel_err"] > 100 * dryrun_mla.TOLERANCE
    assert report["max_rel_err"] >= 0.5 * report["rope_distance"]
    assert not report["ok"]


def test_mla_dryrun_with_the_triton_mla_kernels_on_the_twin():
    """The newest release, MTP, with the twin running our AI Core ops' Triton bodies
    (``triton_mla.mla_decode_kernel`` and the combine, launched by `mla_step` on the NPU
    path, interpreted) instead of the C reference."""
    env = _env(RELEASES[1])
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    environ = _clean_env(tree)
    environ["AICPU_TILING_TWIN_AICORE"] = "triton"
    environ.pop("TRITON_INTERPRET", None)  # the twin's Triton driver runs device launches
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--model", "mla",
                           "--steps", "1",
                           "--spec-tokens", "1"], capture_output=True, text=True, env=environ,
                          cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert report["aicore_body"] == "triton"
    assert [layer["path"] for layer in report["layers"]] == ["device"] * 3
    assert report["max_rel_err"] <= report["tolerance"] and report["ok"]


@pytest.mark.parametrize("release, placement, spec_tokens", OTHER_PAIR)
def test_a_mixed_mla_graph_updates_only_the_host_path_layer(release, placement, spec_tokens):
    """Layer 1 is built with ``enable_kv_nz`` (the NZ cache layout): it keeps vLLM-Ascend's
    path in the same graph as two device-path MLA layers. vLLM-Ascend's own capture and its
    own ``update_graph_params`` (narrowed by the hook to the host-path layers) run their task
    group and task update around a recording stand-in for FIA v2, which the twin does not
    model: one update per step, on layer 1's query, none on ours; ours match float64."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--model", "mla",
                           "--steps", "2",
                           "--host-layers", "1", "--placement", placement,
                           "--spec-tokens", str(spec_tokens)], capture_output=True, text=True,
                          env=_clean_env(tree), cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert [layer["path"] for layer in report["layers"]] == ["device", "host", "device"]
    assert "enable_kv_nz" in report["layers"][1]["reason"]
    assert [layer["updates_per_step"] for layer in report["layers"]] == [0, 1, 0]
    assert report["updates_per_step_all"] == 1 and report["updates_per_step_after"] == 0
    assert report["layers"][1]["max_rel_err"] is None  # the stand-in computes nothing
    assert report["max_rel_err"] <= report["tolerance"] and report["ok"]


def test_mla_with_heads_that_are_not_a_power_of_two():
    """20 heads per rank (GLM-4.7-Flash's count, vLLM-Ascend's comment in
    ``AscendMLAImpl.__init__``): vLLM-Ascend pads the heads to 32 for FIA
    (``num_heads_padded``) and slices its output back (``attn_output[: self.num_heads]``); the
    hook writes the first 20 heads of an output of the padded shape and hands the same slice
    to ``_v_up_proj``."""
    env = _env(RELEASES[1])
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--model", "mla",
                           "--steps", "2",
                           "--num-heads", "20", "--spec-tokens", "1"], capture_output=True,
                          text=True, env=_clean_env(tree), cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert [layer["path"] for layer in report["layers"]] == ["device"] * 3
    assert {(layer["num_heads"], layer["num_heads_padded"]) for layer in report["layers"]} == {
        (20, 32)}
    assert report["max_rel_err"] <= report["tolerance"] and report["ok"]


MLA_PATCH_ROUND_TRIP = """
from pyruntime import npu_twin
npu_twin.activate()
import importlib, json
from pyruntime import hook
import vllm_ascend.ops
m = importlib.import_module("vllm_ascend.attention.mla_v1")
def targets():
    return [m.AscendMLAImpl.__dict__[n] for n in ("_forward_decode", "update_graph_params",
                                                 "forward")] + [m.AscendMLAMetadataBuilder.__dict__["build"]]
class Engine:
    name = "stand-in"
    def capture_attention(self, capture): pass
    def capture_mla(self, capture): pass
before = targets()
report = hook.install(engine_factory=lambda: (Engine(), None))
patched = [a is not b for a, b in zip(before, targets())]
modules = hook.status().patched_modules
hook.uninstall()
restored = [a is b for a, b in zip(before, targets())]
print(json.dumps({"patched": patched, "restored": restored, "modules": modules}))
"""


@pytest.mark.parametrize("release", RELEASES)
def test_the_mla_patch_installs_and_uninstalls_in_the_real_module(release):
    """The four MLA targets are replaced when mla_v1 is imported under the hook, and
    uninstall() puts back exactly the originals."""
    env = _env(release)
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    proc = subprocess.run([str(python), "-c", MLA_PATCH_ROUND_TRIP], capture_output=True,
                          text=True, env=_clean_env(tree), cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    result = json.loads(lines[-1])
    assert "vllm_ascend.attention.mla_v1" in result["modules"]
    assert result["patched"] == [True] * 4 and result["restored"] == [True] * 4


def test_every_kernel_variant_is_launched_eagerly_before_its_capture(tmp_path):
    """Review 2 item 5, on the newest release with the twin running our Triton bodies: the dry
    run warms up each bucket eagerly before capturing it, as vLLM's capture_model does
    (``_warmup_and_capture``; vLLM-Ascend's ``cudagraph_num_of_warmups = 1``). Every Triton
    kernel specialization our kernels launch (counted at the twin's ``JITFunction.run`` seam
    by ``dryrun_counting_engine``) had its first launch outside any capture: zero first
    launches, so zero Triton compilations, inside vLLM's captures. The mixed set has every
    switch (window, soft cap, sinks) and two buckets."""
    env = _env(RELEASES[1])
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    environ = _clean_env(tree)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(REPO / "tests" / "hook")])
    environ["AICPU_TILING_ENGINE"] = "dryrun_counting_engine:make"
    environ["AICPU_TILING_TWIN_AICORE"] = "triton"
    environ.pop("TRITON_INTERPRET", None)  # the twin's Triton driver runs device launches
    log = tmp_path / "launches.json"
    environ["AICPU_TILING_TEST_LAUNCH_LOG"] = str(log)
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--placement", "graph",
                           "--steps", "1"], capture_output=True, text=True, env=environ,
                          cwd=REPO, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    run = json.loads(lines[-1])
    assert [layer["path"] for layer in run["layers"]] == ["device"] * 5
    assert all(layer["max_rel_err"] <= 1e-4 for layer in run["layers"])
    counts = json.loads(log.read_text())
    assert counts["launches"]["captured"] > 0 and counts["specializations"] > 0
    assert counts["first_launched_in_capture"] == [], counts["first_launched_in_capture"]
    assert counts["cold_captures"] == [] and counts["warmed_variants"] > 0


def test_every_mla_kernel_variant_is_launched_eagerly_before_its_capture(tmp_path):
    """Review 2 item 5, MLA half, on the newest release with the twin running our Triton MLA
    bodies: the MLA dry run warms up each bucket eagerly before capturing it, as vLLM's
    capture_model does (vLLM-Ascend's eager ``_forward_decode`` there calls FIA v2 eagerly:
    the dry run's zero-writing stand-in). After it the hook launches the tiling task and our
    MLA kernels once per variant (``warm_up_mla``), so every Triton specialization they launch
    (counted at the twin's ``JITFunction.run`` seam by ``dryrun_counting_engine``) had its
    first launch outside any capture; MTP (q_len 2) and two buckets."""
    env = _env(RELEASES[1])
    python, tree = env / "venv" / "bin" / "python", env / "vllm-ascend"
    environ = _clean_env(tree)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(REPO / "tests" / "hook")])
    environ["AICPU_TILING_ENGINE"] = "dryrun_counting_engine:make"
    environ["AICPU_TILING_TWIN_AICORE"] = "triton"
    environ.pop("TRITON_INTERPRET", None)  # the twin's Triton driver runs device launches
    log = tmp_path / "launches.json"
    environ["AICPU_TILING_TEST_LAUNCH_LOG"] = str(log)
    proc = subprocess.run([str(python), "-m", "pyruntime.hook.dryrun", "--model", "mla",
                           "--placement", "graph", "--steps", "1", "--spec-tokens", "1"],
                          capture_output=True, text=True, env=environ, cwd=REPO, timeout=600,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    run = json.loads(lines[-1])
    assert [layer["path"] for layer in run["layers"]] == ["device"] * 3
    assert run["max_rel_err"] <= run["tolerance"] and run["ok"]
    counts = json.loads(log.read_text())
    assert counts["launches"]["captured"] > 0 and counts["specializations"] > 0
    assert counts["first_launched_in_capture"] == [], counts["first_launched_in_capture"]
    assert counts["cold_captures"] == [] and counts["warmed_variants"] > 0
