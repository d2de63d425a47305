"""Run vLLM-Ascend's own unit tests (CPU) in the env of tools/vllm_env.sh; report as JSON.

Usage:
  python tools/run_vllm_ascend_ut.py --release 0.30.0rc2 [--tests PATH ...] [--json OUT]
                                     [--with-hook | --both] [-k EXPR] [--no-build]

--tests paths are relative to the release's source tree (default: its acl_graph,
attention_v1, mla_v1 and kv_c8 unit tests; a default that a release keeps elsewhere, such as 0.23.0.post1's
tests/ut/compilation/a2/test_acl_graph.py, is found by file name under tests/ut and the
JSON says so). The env is built first when it is missing (unless --no-build).

--with-hook applies aicpu-tiling's import hook before vLLM-Ascend's modules import: the
env gets AICPU_TILING=1 and a path entry holding only this repository's ``pyruntime``
(a symlink, plus an ``aicpu_tiling`` dist-info carrying the vllm.general_plugins entry
point, as an editable install has), and pytest loads tools/vllm_ut_hook_plugin.py with
``-p``, which calls ``pyruntime.hook.install()`` with a recording engine
(``AICPU_TILING_ENGINE``). Nothing is installed into the venv, so runs without the hook
see the env as built, and no build output is written into this repository (an editable
pip install would rebuild pyruntime/_native.abi3.so in place). --both runs without and
with the hook and lists every test whose outcome differs.

The JSON holds the counts (passed/failed/skipped/errors, xfailed/xpassed), the node ids
of failures and errors with the first lines of their messages, every test's outcome, the
hook's status (patched or why not) and the pytest log's path. Exit status: 0 all passed,
1 some test failed or errored, 2 the run itself failed (env, paths, pytest crash).

This file is also the pytest plugin that records outcomes (``-p run_vllm_ascend_ut``):
importing it has no side effects and needs only the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
DEFAULT_TESTS = (
    "tests/ut/compilation/test_acl_graph.py",
    "tests/ut/attention/test_attention_v1.py",
    # the MLA patch (pyruntime/hook/vllm_ascend_mla.py): tests/ut/attention/a2/ in 0.23
    "tests/ut/attention/test_mla_v1.py",
    # the C8 patch (pyruntime/hook/vllm_ascend_c8.py): the class surgery that makes C8 layers;
    # tests/ut/quantization/methods/ in 0.23, methods/kv_cache/ in 0.30
    "tests/ut/quantization/methods/kv_cache/test_kv_c8.py",
)
RESULTS_ENV = "AICPU_TILING_UT_RESULTS"
HOOK_REPORT_ENV = "AICPU_TILING_UT_HOOK_REPORT"
MESSAGE_LINES = 6

# --------------------------------------------------------------------------------------
# pytest plugin half: loaded inside the env's interpreter as `-p run_vllm_ascend_ut`.


def _message(report) -> str:
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, lineno, reason)
        return f"{longrepr[2]}\n  at {longrepr[0]}:{longrepr[1]}"
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = f"{crash.message}\n  at {crash.path}:{crash.lineno}"
    else:
        text = getattr(report, "longreprtext", "") or str(getattr(report, "longrepr", "") or "")
        text = "\n".join(text.strip().splitlines()[-MESSAGE_LINES:])
    return "\n".join(text.splitlines()[:MESSAGE_LINES])


def _record(entry: dict) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def pytest_runtest_logreport(report):
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}
    if hasattr(report, "wasxfail"):
        entry["wasxfail"] = True
    if report.failed or (report.skipped and not entry.get("wasxfail")):
        entry["message"] = _message(report)
    _record(entry)


def pytest_collectreport(report):
    if report.failed:
        _record({"nodeid": report.nodeid, "when": "collect", "outcome": "failed",
                 "message": _message(report)})  # fmt: skip


# --------------------------------------------------------------------------------------
# runner half


def _outcomes(lines: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """Node id -> final outcome, and node id -> message for failures/errors/skips."""
    outcome: dict[str, str] = {}
    messages: dict[str, str] = {}
    for e in lines:
        node, when, result = e["nodeid"], e["when"], e["outcome"]
        if result == "failed":
            final = "failed" if when == "call" else "error"
        elif result == "skipped":
            final = "xfailed" if e.get("wasxfail") else "skipped"
        else:
            final = "xpassed" if e.get("wasxfail") else "passed"
        current = outcome.get(node)
        # an error in setup/teardown outranks the call's result; a call result beats setup's pass
        if current == "error" or (current in ("failed", "skipped", "xfailed", "xpassed")
                                  and final == "passed"):  # fmt: skip
            continue
        outcome[node] = final
        if "message" in e and final in ("failed", "error", "skipped"):
            messages[node] = e["message"]
    return outcome, messages


def _count(outcome: dict[str, str]) -> dict[str, int]:
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "xfailed", "xpassed")}
    for v in outcome.values():
        counts["errors" if v == "error" else v] += 1
    counts["total"] = len(outcome)
    return counts


def _env_dir(release: str, root: str | None) -> Path:
    base = root or os.environ.get("AICPU_TILING_VLLM_ENVS") or "~/.cache/aicpu-tiling/vllm-envs"
    return Path(base).expanduser() / release


def _ensure_env(release: str, env_dir: Path, build: bool) -> dict:
    stamp = env_dir / "READY.json"
    if not stamp.exists():
        if not build:
            raise RuntimeError(f"no env at {env_dir}: run tools/vllm_env.sh {release}")
        print(f"run_vllm_ascend_ut: building the {release} env (minutes)", file=sys.stderr)
        env = dict(os.environ, AICPU_TILING_VLLM_ENVS=str(env_dir.parent))
        rc = subprocess.run(["bash", str(TOOLS / "vllm_env.sh"), release], env=env,
                            check=False).returncode
        if rc != 0 or not stamp.exists():
            raise RuntimeError(f"tools/vllm_env.sh {release} failed (exit {rc})")
    return json.loads(stamp.read_text())


def _resolve_tests(tree: Path, requested: list[str]) -> tuple[list[str], dict[str, str]]:
    """Paths as given when they exist; else the one file of that name under tests/ut."""
    found, moved = [], {}
    for req in requested:
        path, _, rest = req.partition("::")
        if (tree / path).exists():
            found.append(req)
            continue
        name, parent = Path(path).name, Path(path).parent.name
        hits = sorted(p.relative_to(tree).as_posix() for p in (tree / "tests" / "ut").rglob(name))
        near = [h for h in hits if parent in Path(h).parts] or hits
        if len(near) != 1:
            raise RuntimeError(f"{path} is not in this release's tree; candidates: {near or 'none'}")
        moved[req] = near[0] + (f"::{rest}" if rest else "")
        found.append(moved[req])
    return found, moved


def _hook_path(env_dir: Path) -> Path:
    """A path entry with this repository's pyruntime only (symlink) and its dist-info."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entry = env_dir / "hook-path"
    entry.mkdir(exist_ok=True)
    link = entry / "pyruntime"
    if not (link.is_symlink() and os.readlink(link) == str(REPO / "pyruntime")):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(REPO / "pyruntime", target_is_directory=True)
    for old in entry.glob("*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = entry / f"aicpu_tiling-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for g, eps in groups.items()
        )
    )
    (info / "INSTALLER").write_text("tools/run_vllm_ascend_ut.py\n")
    return entry


def _git_state() -> dict:
    """HEAD and the uncommitted paths under pyruntime/ (read-only git commands)."""

    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True,
                           check=False)
        return r.stdout.rstrip() if r.returncode == 0 else ""

    dirty = [line[3:] for line in git("status", "--porcelain", "--", "pyruntime").splitlines()]
    return {"head": git("rev-parse", "HEAD").strip() or None, "uncommitted_pyruntime_paths": dirty}


FREEZE_CODE = ("import importlib.metadata as m; "
               "print('\\n'.join(sorted({f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()})))")


def env_drift(python: str, env_dir: Path) -> dict | None:
    """Distributions added, removed or changed in the venv since tools/vllm_env.sh built it."""
    freeze = env_dir / "freeze.txt"
    if not freeze.exists():
        return {"unknown": "no freeze.txt (env built before drift checks)"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    now = subprocess.run([python, "-c", FREEZE_CODE], capture_output=True, text=True, env=env,
                         check=False)
    if now.returncode != 0:
        return {"unknown": now.stderr.strip().splitlines()[-1:]}

    def parse(text: str) -> dict[str, str]:
        return dict(line.split("==", 1) for line in text.splitlines() if "==" in line)

    built, current = parse(freeze.read_text()), parse(now.stdout)
    drift = {
        "added": sorted(f"{k}=={v}" for k, v in current.items() if k not in built),
        "removed": sorted(f"{k}=={v}" for k, v in built.items() if k not in current),
        "changed": sorted(f"{k} {built[k]} -> {v}" for k, v in current.items()
                          if k in built and built[k] != v),
    }
    return drift if any(drift.values()) else None


def run_once(args, stamp: dict, env_dir: Path, with_hook: bool) -> dict:
    tree = Path(stamp["tree"])
    python = stamp["python"]
    tests, moved = _resolve_tests(tree, args.tests or list(DEFAULT_TESTS))
    runs = env_dir / "runs"
    runs.mkdir(exist_ok=True)
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{'hook' if with_hook else 'plain'}"
    results, log = runs / f"{tag}.jsonl", runs / f"{tag}.log"
    hook_report = runs / f"{tag}.hook.json"
    for p in (results, hook_report):
        p.unlink(missing_ok=True)

    env = {k: v for k, v in os.environ.items() if not k.startswith("AICPU_TILING")}
    env.pop("PYTHONPATH", None)
    env.update(
        # as vLLM-Ascend's CPU unit-test job (.github/workflows/_selected_tests.yaml)
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        VLLM_LOGGING_LEVEL="ERROR",
        HF_HUB_OFFLINE="1",
        VLLM_WORKER_MULTIPROC_METHOD="spawn",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env[RESULTS_ENV] = str(results)
    path = [str(tree), str(TOOLS)]
    plugins = ["-p", "run_vllm_ascend_ut"]
    if with_hook:
        path.insert(1, str(_hook_path(env_dir)))
        plugins += ["-p", "vllm_ut_hook_plugin"]
        env["AICPU_TILING"] = "1"
        env[HOOK_REPORT_ENV] = str(hook_report)
    env["PYTHONPATH"] = os.pathsep.join(path)
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", *plugins, "-q", "--color=no",
           *(["-k", args.k] if args.k else []), *args.pytest_arg, *tests]  # fmt: skip

    start = time.monotonic()
    with open(log, "w") as out:
        try:
            rc = subprocess.run(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                timeout=args.timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    duration = time.monotonic() - start
    lines = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    outcome, messages = _outcomes(lines)
    counts = _count(outcome)
    failures = [
        {"nodeid": n, "outcome": o, "message": messages.get(n, "")}
        for n, o in outcome.items()
        if o in ("failed", "error")
    ]
    hook = None
    if with_hook:
        hook = (json.loads(hook_report.read_text()) if hook_report.exists()
                else {"state": "unknown", "reason": "the hook plugin wrote no report"})  # fmt: skip
    if with_hook:  # the hook runs from this working tree: say which state of it
        hook["repo"] = _git_state()
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
    drift = env_drift(python, env_dir)
    if drift:
        print(f"run_vllm_ascend_ut: the {stamp['release']} venv differs from its build: {drift}"
              " (rebuild: rm -rf the env, rerun tools/vllm_env.sh)", file=sys.stderr)  # fmt: skip
    return {
        "release": stamp["release"],
        "env_drift": drift,
        "vllm": stamp.get("vllm"),
        "env": str(env_dir),
        "with_hook": with_hook,
        "tests": tests,
        "resolved": moved,
        "command": cmd,
        "pytest_exit_code": rc,
        "pytest_summary": tail[0] if tail else None,
        "duration_s": round(duration, 1),
        "counts": counts,
        "failures": failures,
        "skipped": {n: messages.get(n, "") for n, o in outcome.items() if o == "skipped"},
        "hook": hook,
        "outcomes": outcome,
        "log": str(log),
    }


def differences(a: dict, b: dict) -> list[dict]:
    """Tests whose outcome differs between run a and run b (a missing test counts)."""
    msgs_b = {f["nodeid"]: f["message"] for f in b["failures"]} | b.get("skipped", {})
    msgs_a = {f["nodeid"]: f["message"] for f in a["failures"]} | a.get("skipped", {})
    out = []
    for node in sorted(set(a["outcomes"]) | set(b["outcomes"])):
        oa, ob = a["outcomes"].get(node, "absent"), b["outcomes"].get(node, "absent")
        if oa != ob:
            out.append({"nodeid": node, "without_hook": oa, "with_hook": ob,
                        "message": msgs_b.get(node) or msgs_a.get(node, "")})  # fmt: skip
    return out


def _summary(r: dict) -> str:
    c = r["counts"]
    hook = ""
    if r["with_hook"]:
        h = r["hook"] or {}
        hook = f", hook {h.get('state')}" + (f" ({h['reason']})" if h.get("reason") else "")
        if h.get("patched_modules"):
            hook += f" patched {len(h['patched_modules'])} modules"
    return (f"{r['release']} {'with' if r['with_hook'] else 'without'} hook: {c['passed']} passed, "
            f"{c['failed']} failed, {c['skipped']} skipped, {c['errors']} errors "
            f"in {r['duration_s']} s{hook}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True, help="vllm-ascend release, e.g. 0.30.0rc2")
    ap.add_argument("--tests", nargs="+", help="paths (or node ids) relative to the tree")
    ap.add_argument("--json", help="write the JSON report here (default: stdout)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--with-hook", action="store_true", help="apply pyruntime.hook first")
    mode.add_argument("--both", action="store_true", help="run without and with the hook, diff")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--pytest-arg", action="append", default=[], help="extra pytest argument")
    ap.add_argument("--envs-root", help="default: $AICPU_TILING_VLLM_ENVS or ~/.cache/...")
    ap.add_argument("--no-build", action="store_true", help="fail instead of building the env")
    ap.add_argument("--timeout", type=float, default=3600, help="pytest wall-clock limit, s")
    args = ap.parse_args(argv)

    env_dir = _env_dir(args.release, args.envs_root)
    try:
        stamp = _ensure_env(args.release, env_dir, build=not args.no_build)
        if args.both:
            plain = run_once(args, stamp, env_dir, with_hook=False)
            hooked = run_once(args, stamp, env_dir, with_hook=True)
            report = {"without_hook": plain, "with_hook": hooked,
                      "differences": differences(plain, hooked)}  # fmt: skip
            runs = [plain, hooked]
        else:
            report = run_once(args, stamp, env_dir, with_hook=args.with_hook)
            runs = [report]
    except (RuntimeError, OSError) as exc:
        print(f"run_vllm_ascend_ut: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    for r in runs:
        print(f"run_vllm_ascend_ut: {_summary(r)}", file=sys.stderr)
    if args.both:
        print(f"run_vllm_ascend_ut: {len(report['differences'])} test(s) differ", file=sys.stderr)
    if any(not r["outcomes"] or r["pytest_exit_code"] not in (0, 1) for r in runs):
        for r in runs:
            if not r["outcomes"] or r["pytest_exit_code"] not in (0, 1):
                print(f"run_vllm_ascend_ut: pytest exit {r['pytest_exit_code']}: {r['pytest_summary']}"
                      f" (log: {r['log']})", file=sys.stderr)  # fmt: skip
        return 2
    return 1 if any(r["counts"]["failed"] or r["counts"]["errors"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
