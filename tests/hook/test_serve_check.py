"""``aicpu-tiling serve-check``'s parts that need no vLLM (issue 29, items 1 and 3): the token
judge on synthetic logits, the tolerance, the tiny models' configs, the report's exact
schema and verdict from synthetic runs, and the command line's errors. The engine runs
themselves are in tests/hook/test_engine_check.py (behind the ``engine`` marker)."""

from __future__ import annotations

import json

import pytest

from pyruntime.cli import main
from pyruntime.hook.dryrun import engine_check, judge, tiny_models
from pyruntime.hook.dryrun.engine_check import EngineRun

VOCAB = 8


def logits_with(values: dict[int, float]) -> list[float]:
    """Logits over VOCAB tokens: -5 everywhere except `values`."""
    out = [-5.0] * VOCAB
    for token, value in values.items():
        out[token] = value
    return out


def never_called(i: int):
    raise AssertionError("the reference must not be computed for identical tokens")


# -- the judge -------------------------------------------------------------------------------


def test_identical_tokens_need_no_reference():
    assert judge.judge_request(0, [3, 1, 4], [3, 1, 4], never_called, "bfloat16") is None


def test_a_near_tie_within_the_tolerance_passes():
    # the probe's case: 7.7695 against 7.7372 (margin 0.032); bf16 tolerance 4 * 2^-7 * 7.77
    ref = logits_with({5: 7.7695, 2: 7.7372})
    d = judge.judge_request(1, [0, 5, 5], [0, 2, 7], lambda i: ref, "bfloat16")
    assert (d.request, d.token, d.without, d.with_) == (1, 1, 5, 2)
    assert d.margin == pytest.approx(0.0323)
    assert d.tolerance == pytest.approx(4 * 2 ** -7 * 7.7695)
    assert d.ok


def test_a_margin_past_the_tolerance_fails():
    ref = logits_with({5: 8.0, 2: 7.0})  # margin 1.0 > 4 * 2^-7 * 8 = 0.25
    d = judge.judge_request(0, [5], [2], lambda i: ref, "bfloat16")
    assert d.margin == pytest.approx(1.0) and d.tolerance == pytest.approx(0.25)
    assert not d.ok


def test_the_same_margin_fails_in_float32():
    ref = logits_with({5: 7.7695, 2: 7.7372})
    d = judge.judge_request(0, [5], [2], lambda i: ref, "float32")
    assert d.tolerance == pytest.approx(4 * 2 ** -23 * 7.7695) and not d.ok


def test_a_token_outside_the_reference_top_two_fails():
    # 2 is third: even with a tiny margin to the best, the hooked token is not a near-tie
    ref = logits_with({5: 7.77, 6: 7.76, 2: 7.75})
    d = judge.judge_request(0, [5], [2], lambda i: ref, "bfloat16")
    assert d.margin is None and not d.ok


def test_an_exact_tie_passes_and_is_judged_by_value_not_index():
    # tokens 1, 4 and 6 tie for best: 6 and 4 are both among the top two by value, though a
    # top two picked by position (a stable sort) would be {1, 4}
    ref = logits_with({6: 3.0, 1: 3.0, 4: 3.0})
    d = judge.judge_request(0, [6], [4], lambda i: ref, "bfloat16")
    assert d.margin == 0.0 and d.ok


def test_the_reference_is_asked_for_the_first_divergence_only():
    asked = []

    def ref(i):
        asked.append(i)
        return logits_with({1: 2.0, 2: 2.0})

    judge.judge_request(0, [0, 0, 1, 9], [0, 0, 2, 8], ref, "bfloat16")
    assert asked == [2]


def test_runs_of_different_lengths_fail():
    d = judge.judge_request(0, [1, 2, 3], [1, 2], never_called, "bfloat16")
    assert d.token == 2 and not d.ok


def test_the_tolerance_grows_with_the_logits_and_needs_a_known_dtype():
    assert judge.tolerance("bfloat16", -10.0) == pytest.approx(2 * judge.tolerance("bfloat16", 5))
    with pytest.raises(KeyError):
        judge.tolerance("int8", 1.0)


# -- the tiny models' configs ------------------------------------------------------------------


def test_the_tiny_models_are_the_architectures_named():
    assert set(tiny_models.CONFIGS) == {"qwen3", "gpt-oss", "deepseek-v3"}
    qwen3, oss, ds = (tiny_models.CONFIGS[n] for n in ("qwen3", "gpt-oss", "deepseek-v3"))
    assert qwen3["architectures"] == ["Qwen3ForCausalLM"]
    assert qwen3["num_attention_heads"] > qwen3["num_key_value_heads"]  # GQA
    assert oss["architectures"] == ["GptOssForCausalLM"]
    # vLLM gpt_oss.py: a window on the even layers
    assert oss["layer_types"] == ["sliding_attention", "full_attention"]
    assert ds["architectures"] == ["DeepseekV3ForCausalLM"]
    # no MoE layer: every layer index is below first_k_dense_replace
    assert ds["first_k_dense_replace"] == ds["num_hidden_layers"]
    # hook-dryrun --model mla's latent geometry
    assert (ds["kv_lora_rank"], ds["qk_rope_head_dim"], ds["v_head_dim"]) == (512, 64, 128)
    for name, config in tiny_models.CONFIGS.items():
        assert len(tiny_models.ATTENTION_LAYERS[name]) == config["num_hidden_layers"]


def test_an_unknown_tiny_model_is_a_typed_error(tmp_path):
    with pytest.raises(tiny_models.TinyModelError, match="unknown tiny model 'llama'"):
        tiny_models.write("llama", tmp_path / "m")
    assert not (tmp_path / "m").exists()


# -- the report --------------------------------------------------------------------------------


def engine_run(hooked: bool, **fields) -> EngineRun:
    base = {"vllm": "0.30.0", "vllm_ascend": "0.30.0rc2", "backend": "npu-twin",
            "dtype": "bfloat16", "tokens": [[1, 2, 3], [4, 5], [6]], "decode_steps": 4,
            "updates": 0 if hooked else 8, "blocking_copies": 12, "synchronizes": 0,
            "tpot_ms": 3.0, "hook_state": "active" if hooked else None,
            "graph_sizes": [1, 2, 3, 4, 5, 6, 7, 8],
            "replays": [[1, 1, 1], [2, 2, 2], [3, 3, 1]],
            "hook_engine": "npu-graph" if hooked else None,
            "device_layers": {"model.layers.0.self_attn.attn": "full_graph_fia",
                              "model.layers.1.self_attn.attn": "full_graph_fia"}
            if hooked else {}}
    base.update(fields)
    return EngineRun(hooked=hooked, **base)


def test_the_report_has_exactly_the_issues_schema_and_passes():
    report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                       engine_run(True), None)
    assert list(report) == [
        "schema", "version", "vllm", "vllm_ascend", "backend", "model", "dtype", "tp", "lora",
        "speculative", "placement", "compilation_mode", "compilation_reason", "graph_sizes",
        "replayed_sizes", "layers", "device_layers", "updates_per_step", "added_per_step",
        "tokens_identical", "divergence", "reference", "tpot_ms", "profile", "ranks",
        "verdict"]
    assert report["schema"] == "aicpu-tiling/serve-check" and report["version"] == 1
    assert report["placement"] == "graph"  # the hook's own, from its engine's name
    assert [layer["path"] for layer in report["layers"]] == ["device", "device"]
    assert set(report["layers"][0]) == {"name", "path", "reason"}
    assert report["updates_per_step"] == {"without": 2.0, "with": 0.0}
    assert report["added_per_step"] == {"blocking_copies": 0.0, "synchronizes": 0.0}
    assert set(report["tpot_ms"]) == {"without", "with"}
    assert report["profile"] is None  # no --profile
    assert report["graph_sizes"] == [1, 2, 3, 4, 5, 6, 7, 8]  # the run's, as vLLM kept them
    assert report["replayed_sizes"] == [1, 2, 3] and report["speculative"] is None
    assert report["verdict"] == "pass"
    json.dumps(report)


@pytest.mark.parametrize("with_fields, divergence", [
    ({"device_layers": {}}, None),                        # nothing moved
    ({"updates": 4}, None),                               # our layers still updated
    ({"blocking_copies": 16}, None),                      # one blocking copy added per step
    ({"replays": [[4, 4, 3]]}, None),                     # the batch never left one graph
    ({"replays": []}, None),                              # no graph replayed at all
    ({"tokens": [[1, 2, 3], [4, 9], [6]]},                # tokens differ, not a near-tie
     judge.Divergence(1, 1, 5, 9, None, 0.1, False)),
])
def test_the_verdict_fails(with_fields, divergence):
    report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                       engine_run(True, **with_fields), divergence)
    assert report["verdict"] == "fail"


def test_a_judged_near_tie_passes_and_is_reported():
    d = judge.Divergence(1, 1, 5, 9, 0.03, 0.24, True)
    report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                       engine_run(True, tokens=[[1, 2, 3], [4, 9], [6]]), d)
    assert report["tokens_identical"] is False
    assert report["divergence"] == {"request": 1, "token": 1, "margin": 0.03, "tolerance": 0.24}
    assert report["verdict"] == "pass"


def test_the_unhooked_run_against_the_fp32_reference(monkeypatch, tmp_path):
    """``--tiny``: the unhooked run's greedy tokens against HF's fp32 greedy tokens, judged as
    the two runs are (the reference is the first run); a divergence past the tolerance fails
    the verdict, a near-tie within it passes and is reported."""
    run = engine_run(False, tokens=[[1, 2, 3], [4, 5], [6]])
    references = {(5, 17, 99, 300, 41): [1, 2, 3], (7, 250, 3, 88): [4, 7],
                  (120, 64, 9, 401, 33, 12): [6]}
    asked = []
    monkeypatch.setattr(engine_check, "PROMPTS", tuple(references))
    monkeypatch.setattr(engine_check, "max_tokens_of", lambda n: [3, 2, 1])

    def reference_tokens(model, prompt, max_tokens, lora=None):
        asked.append((tuple(prompt), max_tokens))
        return references[tuple(prompt)]

    monkeypatch.setattr(engine_check, "reference_tokens", reference_tokens)
    # at request 1's token 1 the reference prefers 7 over 5 by a bf16 near-tie, then by 3
    for logits, ok in ((logits_with({7: 7.7695, 5: 7.7372}), True),
                       (logits_with({7: 7.0, 5: 4.0}), False)):
        monkeypatch.setattr(engine_check, "reference_logits",
                            lambda *a, logits=logits, **k: logits)
        judged = engine_check.judge_against_reference(tmp_path, run, 3)
        assert judged["identical"] is False and judged["ok"] is ok
        assert (judged["divergence"]["request"], judged["divergence"]["token"]) == (1, 1)
        report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                           engine_run(True), None, reference=judged)
        assert report["reference"]["divergence"] == judged["divergence"]
        assert report["verdict"] == ("pass" if ok else "fail")
    assert asked[:2] == [((5, 17, 99, 300, 41), 3), ((7, 250, 3, 88), 2)]
    references[(7, 250, 3, 88)] = [4, 5]
    assert engine_check.judge_against_reference(tmp_path, run, 3) == {
        "identical": True, "ok": True, "divergence": None}


def test_a_device_layer_list_other_than_the_expected_one_fails():
    report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                       engine_run(True), None,
                                       expected_device_layers=["model.layers.0.self_attn.attn"])
    assert report["verdict"] == "fail"


def test_the_requests_shrink_the_batch_through_the_graph_sizes():
    lengths = engine_check.max_tokens_of(10)
    # one request fewer per decode step, from the most a step runs (8) down to 1
    assert lengths == [10, 9, 8, 7, 6, 5, 4, 3]
    assert len(engine_check.PROMPTS) == engine_check.MAX_SEQS == 8
    assert engine_check.max_tokens_of(5) == [5, 4, 3, 2, 1, 1, 1, 1]


def test_at_least_eight_capture_sizes_and_multiples_of_the_verify_rows():
    assert engine_check.graph_sizes() == [1, 2, 3, 4, 5, 6, 7, 8]
    # q_len 3 (2 draft tokens): vLLM rounds sizes up to multiples of 3 and drops those past
    # the largest (adjust_cudagraph_sizes_for_spec_decode), so the check asks for them
    assert engine_check.graph_sizes("ngram") == [3, 6, 9, 12, 15, 18, 21, 24]
    assert engine_check.graph_sizes("self-draft") == [3, 6, 9, 12, 15, 18, 21, 24]


def test_the_self_draft_drafts_with_the_served_model():
    assert engine_check.speculative_config("self-draft", "/m") == {
        "method": "draft_model", "num_speculative_tokens": 2, "model": "/m"}
    assert "model" not in engine_check.speculative_config("ngram", "/m")
    assert "model" not in engine_check.SPECULATIVE_CONFIGS["self-draft"]  # not written into


def test_the_prompts_repeat_an_ngram_the_proposer_can_match():
    config = engine_check.SPECULATIVE_CONFIGS["ngram"]
    shortest = config["prompt_lookup_min"]
    for prompt in engine_check.PROMPTS:
        tail = prompt[-shortest:]
        earlier = [prompt[i:i + shortest] for i in range(len(prompt) - shortest)]
        assert tail in earlier, prompt
        assert all(0 <= t < tiny_models.VOCAB for t in prompt)


def test_the_speculative_report_names_the_verify_rows_and_the_accepted_drafts():
    replays = [[3, 1, 2], [6, 2, 1], [24, 8, 1]]
    report = engine_check.build_report(
        "qwen3", 1, False, None, engine_run(False, replays=replays, accepted_drafts=5),
        engine_run(True, replays=replays, accepted_drafts=5), None, speculative="ngram")
    assert report["speculative"] == {"method": "ngram", "num_speculative_tokens": 2,
                                     "accepted_drafts": {"without": 5, "with": 5},
                                     "max_q_len": 3}
    assert report["replayed_sizes"] == [3, 6, 24] and report["verdict"] == "pass"


def test_the_host_waits_are_the_twins_counters(tmp_path):
    """A blocking H2D copy, a D2H copy and a synchronize on the twin are counted as two
    blocking copies and one synchronize (the twin in a fresh process: it cannot be undone)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pyruntime.npu_twin import STATE_ENV

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), STATE_ENV: str(tmp_path)}
    script = (
        "from pyruntime import npu_twin\n"
        "npu_twin.activate()\n"
        "import json, torch\n"
        "from pyruntime.npu_twin import device\n"
        "from pyruntime.hook.dryrun.engine_check import host_waits\n"
        "stats = device.device().stats\n"
        "before = dict(stats)\n"
        "x = torch.ones(4).to('npu')\n"
        "x.cpu()\n"
        "torch.npu.synchronize()\n"
        "print('WAITS ' + json.dumps(host_waits(stats, before)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    waits = json.loads(proc.stdout.split("WAITS ")[-1])
    assert waits == {"blocking_copies": 2, "synchronizes": 1}


def test_without_an_npu_or_the_twins_pth_it_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    from pyruntime.npu_twin import pth

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed: an NPU run needs no twin")
    monkeypatch.setattr(pth, "installed", lambda site_dir=None: False)
    monkeypatch.setattr(engine_check, "run_child",
                        lambda *a, **k: pytest.fail("a child started without the twin"))
    with pytest.raises(engine_check.EngineCheckError,
                       match="run python -m pyruntime.npu_twin.pth install"):
        engine_check.check(tmp_path, "empty")


def test_a_run_that_stops_is_a_typed_error_naming_it(tmp_path, monkeypatch):
    """The child/parent plumbing where vLLM is missing (this environment, or any without
    it): the unhooked child reports the import error, the parent raises `EngineCheckError`
    with its type and message, and no hooked run starts. (The twin's ``.pth`` check is left
    out: the child stops at ``import vllm`` either way.)"""
    import importlib.util

    monkeypatch.setattr(engine_check, "check_twin_autostart", lambda: None)
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: its engine would start")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(engine_check.EngineCheckError,
                       match="the engine without the hook stopped: ModuleNotFoundError: "
                             "No module named 'vllm'"):
        engine_check.check(tmp_path, "empty")


def test_a_skipped_hook_is_an_error_with_the_hooks_reason(tmp_path, monkeypatch):
    """The hooked run with the hook off (no placement chosen on this machine) is not judged:
    the error carries the hook's own reason, so the user knows what to run."""
    reason = "no tiling placement has been chosen on this machine"
    runs = {False: engine_run(False),
            True: engine_run(True, hook_state="skipped", hook_reason=reason, device_layers={})}
    monkeypatch.setattr(engine_check, "check_twin_autostart", lambda: None)
    monkeypatch.setattr(engine_check, "run_child",
                        lambda model, max_tokens, placement, tp, hooked, lora=None,
                        profile_dir=None, compilation="none", speculative=None: runs[hooked])
    with pytest.raises(engine_check.EngineCheckError,
                       match=f"hook was not active in the hooked run \\(skipped: {reason}\\)"):
        engine_check.check(tmp_path, "qwen3")


# -- the compilation (--compilation) -----------------------------------------------------------


def test_compilation_none_is_mode_none_with_full_decode_graphs():
    config, additional, environ, reason = engine_check.compilation_arguments("none")
    assert config == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                      "cudagraph_capture_sizes": engine_check.graph_sizes()}
    assert additional is None and environ == {} and reason is None


def test_compilation_default_leaves_mode_and_compiler_to_the_release(monkeypatch):
    """Where torch_npu's graph compiler can be imported (an NPU host), ``default`` passes only
    the graph mode and sizes: vLLM's default mode and vLLM-Ascend's default compiler."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_npu.dynamo.npugraph_ex"
                        else real(name, *a))
    monkeypatch.setattr(engine_check, "torch_off_the_release_pin", lambda: None)
    config, additional, environ, reason = engine_check.compilation_arguments("default")
    assert "mode" not in config and config["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert additional is None and environ == {} and reason is None


def test_compilation_default_without_a_graph_compiler_turns_npugraph_ex_off_and_says_why(
        monkeypatch):
    """torch_npu ships neither npugraph_ex nor torchair (the twin, a torch_npu built without
    them): vLLM-Ascend's own switch ``enable_npugraph_ex`` false, and the reason,
    which the report carries as ``compilation_reason``."""
    import importlib.util

    real = importlib.util.find_spec
    asked = []

    def find_spec(name, *a):
        if name in engine_check.GRAPH_COMPILERS:
            asked.append(name)
            return None
        return real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(engine_check, "torch_off_the_release_pin", lambda: None)
    config, additional, environ, reason = engine_check.compilation_arguments("default")
    # vLLM-Ascend's import order
    assert asked == ["torch_npu.dynamo.npugraph_ex", "torch_npu.dynamo.torchair"]
    assert "mode" not in config
    assert environ == {}   # on the release's pin (patched above): nothing else differs
    assert additional == {"ascend_compilation_config": {"enable_npugraph_ex": False}}
    assert "neither npugraph_ex nor torchair" in reason and "enable_npugraph_ex false" in reason
    report = engine_check.build_report(
        "qwen3", 1, False, None, engine_run(False, compilation_mode="VLLM_COMPILE",
                                            compilation_reason=reason),
        engine_run(True, compilation_mode="VLLM_COMPILE", compilation_reason=reason), None)
    assert report["compilation_mode"] == "VLLM_COMPILE"
    assert report["compilation_reason"] == reason


@pytest.mark.parametrize("pin, user, off", [
    ("torch==2.10.0", None, True),       # torch here is not the release's pin
    ("torch==HERE", None, False),        # the pin: vLLM's AOT compile as the release runs it
    ("torch==2.10.0", "1", False),       # the user's own choice stands
])
def test_aot_compile_is_off_only_on_a_torch_other_than_the_releases_pin(monkeypatch, pin,
                                                                          user, off):
    """Off the pin, vLLM's AOT compile off and with it vLLM's bytecode hook, which the
    release's AOT compile never runs (`engine_check.bytecode_hook_runs_only_without_aot_compile`:
    without it vLLM-Ascend 0.30.0rc2's DeepSeek forward stops in the hook's name check)."""
    from importlib import metadata

    import torch

    here = torch.__version__.split("+")[0]
    if here == "2.10.0":
        pytest.skip("torch here is 2.10.0, the pin of the first case")
    monkeypatch.setattr(metadata, "requires",
                        lambda name: [pin.replace("HERE", here), "torch-npu==2.10.0.post4"]
                        if name == "vllm-ascend" else [])
    monkeypatch.setattr(engine_check, "missing_graph_compiler", lambda: None)
    monkeypatch.setattr(engine_check, "custom_op_aliasing_raises", lambda: False)
    for name in ("VLLM_USE_BYTECODE_HOOK", "VLLM_DISABLE_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    if user is None:
        monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_AOT_COMPILE", user)
    _, additional, environ, reason = engine_check.compilation_arguments("default")
    assert additional is None
    if off:
        assert environ == {"VLLM_USE_AOT_COMPILE": "0", "VLLM_USE_BYTECODE_HOOK": "0"}
        assert reason.startswith(f"VLLM_USE_AOT_COMPILE=0: torch {here} here, not "
                                 "vLLM-Ascend's pin 2.10.0")
        assert reason.endswith("; " + engine_check.BYTECODE_HOOK_REASON)
    else:
        assert environ == {} and reason is None


@pytest.mark.parametrize("variable, value", [
    ("VLLM_USE_BYTECODE_HOOK", "1"),      # the user's own choice stands
    ("VLLM_DISABLE_COMPILE_CACHE", "1"),  # the release itself would not AOT-compile: hook on
])
def test_the_bytecode_hook_stays_as_vllm_has_it_where_the_release_would_run_it(
        monkeypatch, variable, value):
    from importlib import metadata

    monkeypatch.setattr(metadata, "requires",
                        lambda name: ["torch==0.0.1"] if name == "vllm-ascend" else [])
    monkeypatch.setattr(engine_check, "missing_graph_compiler", lambda: None)
    monkeypatch.setattr(engine_check, "custom_op_aliasing_raises", lambda: False)
    for name in ("VLLM_USE_AOT_COMPILE", "VLLM_USE_BYTECODE_HOOK",
                 "VLLM_DISABLE_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    _, _, environ, reason = engine_check.compilation_arguments("default")
    assert environ == {"VLLM_USE_AOT_COMPILE": "0"}
    assert "VLLM_USE_BYTECODE_HOOK" not in reason


@pytest.mark.parametrize("pin, ci, user, kept_a_warning", [
    ("torch==0.0.1", "true", None, True),   # off the pin, in a CI job: the check would raise
    ("torch==0.0.1", None, None, False),    # off the pin, no CI: torch only warns already
    ("torch==0.0.1", "true", "1", False),   # the user's own choice stands
    ("torch==HERE", "true", None, False),   # the pin: the release's torch as it is
])
def test_the_custom_op_aliasing_check_stays_a_warning_only_off_the_pin_where_it_would_raise(
        monkeypatch, pin, ci, user, kept_a_warning):
    """vLLM-Ascend 0.23.0.post1's compiled engine stopped in the project's CI (CI=true) and
    not on a developer's machine: torch 2.13 raises on a custom op that returns its input only
    where CI is set (`engine_check.custom_op_aliasing_raises`); torch 2.10, the pin, never
    checks."""
    from importlib import metadata

    import torch
    import torch._functorch.config as functorch_config

    here = torch.__version__.split("+")[0]
    monkeypatch.setattr(metadata, "requires",
                        lambda name: [pin.replace("HERE", here)] if name == "vllm-ascend"
                        else [])
    monkeypatch.setattr(engine_check, "missing_graph_compiler", lambda: None)
    for name in ("VLLM_USE_AOT_COMPILE", "VLLM_USE_BYTECODE_HOOK",
                 "VLLM_DISABLE_COMPILE_CACHE", engine_check.ALIASING_ENV):
        monkeypatch.delenv(name, raising=False)
    if user is not None:
        monkeypatch.setenv(engine_check.ALIASING_ENV, user)
    # torch read CI once, at import (its default): the setting as a CI job's torch has it
    monkeypatch.setattr(functorch_config, "error_on_custom_op_aliasing", ci is not None)
    _, _, environ, reason = engine_check.compilation_arguments("default")
    assert (environ.get(engine_check.ALIASING_ENV) == "0") == kept_a_warning
    assert (reason is not None and engine_check.ALIASING_REASON in reason) == kept_a_warning


_LIBRARIES: list = []


def test_torch_raises_on_a_compiled_custom_op_that_returns_its_input_only_when_told_to():
    """The mechanism on the torch here (why `custom_op_aliasing_raises` exists): a compiled
    graph's first call runs every custom op under torch's aliasing check, which raises with
    ``error_on_custom_op_aliasing`` on and warns with it off."""
    import warnings

    import torch
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "error_on_custom_op_aliasing"):
        pytest.skip(f"torch {torch.__version__} has no custom-op aliasing check")

    # registered as vLLM's direct_register_custom_op does (Library.define and impl: no
    # eager check, unlike torch.library.custom_op), once per process
    if not hasattr(torch.ops.aicpu_tiling_test, "returns_its_input"):
        library = torch.library.Library("aicpu_tiling_test", "FRAGMENT")
        library.define("returns_its_input(Tensor x) -> Tensor")
        library.impl("returns_its_input", lambda x: x,   # what maybe_pad_and_reduce does at TP 1
                     dispatch_key="CPU")
        library._register_fake("returns_its_input", torch.empty_like)
        _LIBRARIES.append(library)   # a Library unregisters its ops when collected
    returns_its_input = torch.ops.aicpu_tiling_test.returns_its_input

    def forward(x):
        return returns_its_input(x + 1) * 2

    for raises in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)
        with functorch_config.patch(error_on_custom_op_aliasing=raises), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if raises:
                with pytest.raises(RuntimeError, match="may not alias any inputs"):
                    compiled(torch.ones(3))
            else:
                assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 4.0))
                assert any("alias" in str(w.message) for w in caught)


def test_dynamo_keeps_an_untaken_branchs_names_in_the_code_vllms_bytecode_hook_reads():
    """Why the bytecode hook goes with the AOT compile (the mechanism, on the torch here):
    the transformed code of a frame that calls ``.update`` only on a branch not taken (as
    vLLM-Ascend's DeepSeek forward does at PP 1) still has ``update`` in ``co_names``, the
    names vLLM's ``bytecode_hook`` checks, although no instruction of it loads that name."""
    import dis

    import torch
    from torch._dynamo import convert_frame

    def forward(x, last_rank: bool):
        y = x * 2
        if not last_rank:
            tensors = {}
            tensors.update({"hidden_states": y})  # the pipeline-parallel branch
            return tensors
        return y + 1

    transformed = {}

    def hook(old_code, new_code):
        if old_code is forward.__code__:
            transformed["code"] = new_code

    handle = convert_frame.register_bytecode_hook(hook)
    try:
        torch._dynamo.reset()
        torch.compile(forward, fullgraph=True, backend="eager")(torch.ones(3), True)
    finally:
        handle.remove()
        torch._dynamo.reset()
    code = transformed["code"]
    assert "update" in code.co_names
    assert not any(ins.argval == "update" for ins in dis.get_instructions(code))


def test_an_unknown_compilation_is_a_typed_error():
    with pytest.raises(engine_check.EngineCheckError, match="unknown compilation 'inductor'"):
        engine_check.compilation_arguments("inductor")


def test_runs_that_compiled_differently_are_not_judged(tmp_path, monkeypatch):
    runs = {False: engine_run(False, compilation_mode="NONE"),
            True: engine_run(True, compilation_mode="VLLM_COMPILE")}
    monkeypatch.setattr(engine_check, "check_twin_autostart", lambda: None)
    monkeypatch.setattr(engine_check, "run_child",
                        lambda model, max_tokens, placement, tp, hooked, lora=None,
                        profile_dir=None, compilation="none", speculative=None: runs[hooked])
    with pytest.raises(engine_check.EngineCheckError, match="the two runs compiled differently"):
        engine_check.check(tmp_path, "qwen3", compilation="default")


def test_the_children_run_on_plain_npu_tensors_unless_told_otherwise(monkeypatch):
    """Dynamo traces plain npu tensors, not the wrapper subclass: the children ask for them
    (where there is no torch_npu); a user's explicit layer passes through."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed: no twin in the children")
    monkeypatch.delenv("AICPU_TILING_TWIN_TENSORS", raising=False)
    assert engine_check.child_env(hooked=False)["AICPU_TILING_TWIN_TENSORS"] == "plain"
    monkeypatch.setenv("AICPU_TILING_TWIN_TENSORS", "wrapper")
    assert engine_check.child_env(hooked=True)["AICPU_TILING_TWIN_TENSORS"] == "wrapper"


def test_the_children_find_triton_as_vllm_does(monkeypatch):
    """No CUDA_VISIBLE_DEVICES trick: with the twin's Triton-Ascend backend active vLLM sets
    HAS_TRITON itself, as on an NPU; the user's own value passes through."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "CUDA_VISIBLE_DEVICES" not in engine_check.child_env(hooked=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert engine_check.child_env(hooked=False)["CUDA_VISIBLE_DEVICES"] == "3"


# -- tensor parallel: one record per worker -----------------------------------------------------


def rank_record(rank: int, hooked: bool, **fields) -> dict:
    """What `engine_check.worker_counts` returns from the worker of `rank` (on npu:`rank`)."""
    layers = {"model.layers.0.self_attn.attn": "full_graph_fia",
              "model.layers.1.self_attn.attn": "full_graph_fia"}
    record = {"rank": rank, "device": f"npu:{rank}", "pid": 100 + rank,
              "updates": 0 if hooked else 4, "blocking_copies": 3, "synchronizes": 0,
              "collectives_issued": 8, "collectives_replayed": 28,
              "replays": [[4, 4, 2], [2, 2, 3], [1, 1, 2]],
              "hook_state": "active" if hooked else None, "hook_reason": None,
              "hook_engine": "npu-graph" if hooked else None,
              "device_layers": layers if hooked else {}, "host_layers": {}}
    record.update(fields)
    return record


def tp_run(hooked: bool, *records: dict) -> EngineRun:
    run = EngineRun(hooked=hooked, tokens=[[1, 2, 3], [4, 5], [6]], decode_steps=4,
                    ranks=list(records))
    engine_check.combine_ranks(run, {"blocking_copies": 1, "synchronizes": 0})
    return run


def test_two_ranks_are_summed_and_pass_with_both_layers_moved_on_both():
    without = tp_run(False, rank_record(0, False), rank_record(1, False))
    with_ = tp_run(True, rank_record(0, True), rank_record(1, True))
    # the updates and host waits of both workers, plus the engine process's own waits
    assert (without.updates, without.blocking_copies, without.synchronizes) == (8, 7, 0)
    assert with_.hook_state == "active" and sorted(with_.device_layers) == [
        "model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    report = engine_check.build_report("qwen3", 2, False, "graph", without, with_, None)
    assert report["updates_per_step"] == {"without": 2.0, "with": 0.0}
    assert [r["device"] for r in report["ranks"]] == ["npu:0", "npu:1"]
    assert report["ranks"][1]["updates_per_step"] == {"without": 1.0, "with": 0.0}
    assert report["ranks"][1]["collectives_replayed"] == {"without": 28, "with": 28}
    assert report["ranks"][0]["device_layers"] == ["model.layers.0.self_attn.attn",
                                                   "model.layers.1.self_attn.attn"]
    assert report["verdict"] == "pass"


def test_a_rank_without_the_hook_is_named_and_not_active():
    """Rank 0's hook alone active (the workers of TP 2 are other processes, where only vLLM's
    plugin installs it): the run is not 'active', and the reason names rank 1."""
    with_ = tp_run(True, rank_record(0, True),
                   rank_record(1, True, hook_state="waiting", hook_reason="never installed",
                               device_layers={}))
    assert with_.hook_state == "waiting"
    assert with_.hook_reason == "rank 1: never installed"


def test_a_layer_moved_on_one_rank_only_is_on_the_host_path_and_fails():
    with_ = tp_run(True, rank_record(0, True),
                   rank_record(1, True, device_layers={
                       "model.layers.0.self_attn.attn": "full_graph_fia"},
                       host_layers={"model.layers.1.self_attn.attn": "a reason"}))
    assert list(with_.device_layers) == ["model.layers.0.self_attn.attn"]
    assert with_.host_layers == {"model.layers.1.self_attn.attn": "rank 1: a reason"}
    report = engine_check.build_report(
        "qwen3", 2, False, "graph", tp_run(False, rank_record(0, False), rank_record(1, False)),
        with_, None, expected_device_layers=["model.layers.0.self_attn.attn",
                                             "model.layers.1.self_attn.attn"])
    assert report["verdict"] == "fail"


def test_a_worker_without_the_hook_says_how_vllm_installs_it(monkeypatch):
    """What a worker reports when the hook was never installed in its process (it would run
    vLLM-Ascend's own path): the reason names vLLM's plugin entry point."""
    from types import SimpleNamespace

    from pyruntime import hook
    from pyruntime.hook.activation import Report
    from pyruntime.hook.dryrun import engine_workers

    monkeypatch.setattr(hook, "status", lambda: Report())
    record = engine_workers.counts(SimpleNamespace(rank=1, device="npu:1"), True)
    assert (record["rank"], record["device"], record["hook_state"]) == (1, "npu:1", "waiting")
    assert "vllm.general_plugins entry point" in record["hook_reason"]
    run = tp_run(True, rank_record(0, True), record)
    assert run.hook_state == "waiting" and run.hook_reason.startswith("rank 1: the hook is not")


def test_the_text_report_has_a_line_per_rank_at_tp_2():
    from pyruntime.cli.serve_check import render

    report = engine_check.build_report(
        "qwen3", 2, False, "graph", tp_run(False, rank_record(0, False), rank_record(1, False)),
        tp_run(True, rank_record(0, True), rank_record(1, True)), None)
    text = render(report)
    assert ("rank 1 (npu:1): 2 layers on the device path, task updates per step 1 without / "
            "0 with, collectives run by replays 28 / 28") in text


def test_the_hooked_child_gets_the_hooks_vllm_plugin_where_it_is_not_installed(monkeypatch):
    """Run from a checkout (not installed), vLLM's workers would start without the hook: the
    hooked child's PYTHONPATH starts with a folder whose dist-info names the hook's plugin in
    ``vllm.general_plugins``, which vLLM loads in every process it starts; the unhooked
    child's has none."""
    import os
    from importlib.metadata import distributions
    from types import SimpleNamespace

    seen = {}

    def fake_run(cmd, env, **kwargs):
        first = env["PYTHONPATH"].split(os.pathsep)[0]
        seen[env["AICPU_TILING"]] = [ep.value for d in distributions(path=[first])
                                     for ep in d.entry_points
                                     if ep.group == "vllm.general_plugins"]
        line = engine_check.RESULT_PREFIX + json.dumps(EngineRun(hooked=True).__dict__)
        return SimpleNamespace(stdout=line + "\n", stderr="", returncode=0)

    monkeypatch.setenv("PYTHONPATH", "/nonexistent-checkout")
    monkeypatch.setattr(engine_check, "hook_plugin_installed", lambda: False)
    monkeypatch.setattr(engine_check.subprocess, "run", fake_run)
    engine_check.run_child(engine_check.Path("m"), 8, "graph", 2, hooked=True)
    engine_check.run_child(engine_check.Path("m"), 8, "graph", 2, hooked=False)
    assert seen == {"1": ["pyruntime.hook.vllm_plugin:register"], "0": []}


def test_more_ranks_than_twin_devices_is_a_typed_error_naming_the_variable(tmp_path,
                                                                          monkeypatch):
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed: the NPUs are real")
    monkeypatch.setattr(engine_check, "check_twin_autostart", lambda: None)
    monkeypatch.setattr(engine_check, "run_child",
                        lambda *a, **k: pytest.fail("a child started without its devices"))
    monkeypatch.setenv("AICPU_TILING_TWIN_DEVICES", "2")
    with pytest.raises(engine_check.EngineCheckError,
                       match="--tp 4 needs 4 NPUs and the NPU twin has 2: set "
                             "AICPU_TILING_TWIN_DEVICES=4"):
        engine_check.check(tmp_path, "qwen3", tp=4)


# -- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["serve-check"], "one of the arguments --model --tiny is required"),
    (["serve-check", "--tiny", "qwen3", "--model", "x"], "not allowed with"),
    (["serve-check", "--tiny", "llama"], "invalid choice"),
    (["serve-check", "--tiny", "qwen3", "--spec", "eagle"], "invalid choice"),
    (["serve-check", "--tiny", "qwen3", "--max-tokens", "4"], "--max-tokens 4"),
    (["serve-check", "--tiny", "qwen3", "--max-tokens", "129"], "--max-tokens 129"),
    (["serve-check", "--tiny", "qwen3", "--tp", "9"], "--tp 9"),
    (["serve-check", "--tiny", "qwen3", "--compilation", "inductor"], "invalid choice"),
    (["serve-check", "--tiny", "gpt-oss", "--lora"],
     "--lora writes a tiny adapter for --tiny qwen3 only"),
    (["serve-check", "--model", "/nonexistent", "--lora"], "--lora writes a tiny adapter"),
    (["serve-check", "--model", "/nonexistent"], "no config.json there"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_without_vllm_it_says_so(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["serve-check", "--tiny", "qwen3"]) == 2
    assert "vLLM is not installed here" in capsys.readouterr().err


def test_the_text_report_names_the_divergence():
    from pyruntime.cli.serve_check import render

    d = judge.Divergence(1, 6, 174, 12, 0.0323, 0.2428, True)
    report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                       engine_run(True, tokens=[[1, 2, 3], [4, 9], [6]]), d)
    text = render(report)
    assert "request 1 differs from token 6: reference margin 0.0323 (tolerance 0.2428)" in text
    assert "graph sizes replayed: [1, 2, 3]" in text
    assert text.endswith("verdict: pass")
