#!/usr/bin/env bash
# Build (once) a CPU test environment in which vLLM-Ascend's own unit tests run.
#
# Usage: tools/vllm_env.sh RELEASE            e.g. 0.30.0rc2, 0.23.0.post1
#
# Creates ${AICPU_TILING_VLLM_ENVS:-~/.cache/aicpu-tiling/vllm-envs}/RELEASE/ with
#   venv/          python3 -m venv (no system site packages): torch==2.13.0 (CPU build),
#                  vLLM built from its sdist with VLLM_TARGET_DEVICE=empty, vLLM-Ascend's
#                  requirements minus the Ascend/CUDA-only ones, pytest and friends, and a
#                  torchvision stand-in (the PyPI wheel is CUDA-linked, see step_torchvision)
#   vllm-ascend/   the release's source tree, to put on sys.path (PYTHONPATH): with
#                  vllm_ascend/_build_info.py (device type A2) and
#                  vllm_ascend-RELEASE.dist-info (METADATA + entry_points.txt from the sdist),
#                  so importlib.metadata.version("vllm-ascend") == RELEASE
#                  and what aicpu-tiling's NPU twin and engine need (step_twin)
#   constraints.txt  torch==2.13.0 (and no real torchvision) for every pip call
#   logs/          one log per step;  READY.json  the stamp of a finished env
# Finished steps are skipped on a rerun (.steps/); a finished env returns in seconds.
# Every call, cached env or not, also (re)writes the NPU twin's start-up file into the venv
# (install_twin_pth below: not part of RECIPE, so it never rebuilds an env): the twin then
# activates in every process of the venv that has AICPU_TILING_TWIN=1 and this checkout on
# PYTHONPATH (the model-inspection subprocess, engine core and workers of vLLM); it is inert
# without that variable. To run only that step on an env: tools/vllm_env.sh RELEASE (cached).
# The vLLM version is the one the release pins (.github/vllm-release-tag.commit, else
# the Dockerfile's VLLM_TAG). Archives come from ${AICPU_TILING_WHEELS:-~/.cache/aicpu-tiling/wheels},
# fetched by tools/fetch_sdists.py when missing (a `pip download --no-binary :all:` of vLLM
# fails: that flag also forbids the torch wheel its isolated build needs).
# Versions: tools/vllm-env-locks/RELEASE.txt, where it exists, names every other package of
# the venv (a freeze.txt of an env the whole test suite passed in, less torch, vLLM and pip);
# after the steps have installed what they resolve today, step_lock puts each package at the
# lock's version and removes what the lock does not name, so an env built today holds what
# it held when the lock was written, whatever PyPI has released since (on 2026-12-06 a fresh
# 0.23.0.post1 env stopped at `import vllm.config`: see step_ascend_deps). The pins are not
# constraints of the steps: the release's requirements replace some of vLLM's (fastapi and
# starlette on 0.30.0rc2), so no one set satisfies every step. The lock's hash is in
# READY.json: a changed lock rebuilds the env.
# To refresh a lock: AICPU_TILING_VLLM_UNLOCKED=1 tools/vllm_env.sh RELEASE (after removing
# the env), run the whole test suite, then write the env's freeze.txt over the lock, less
# what it never pins: grep -v -i -E '^(torch|vllm|pip)==' ENV/freeze.txt > LOCK.
# Env overrides: AICPU_TILING_VLLM_VERSION (the vLLM to pair), AICPU_TILING_PYTHON (python3),
# AICPU_TILING_VLLM_UNLOCKED=1 (build without the lock).
# Exit 0 when the env is ready; otherwise 1 and one line "vllm_env: ..." on stderr.
set -uo pipefail
unset PYTHONPATH PYTHONHOME   # nothing from the caller's interpreter setup leaks in

RECIPE=3   # bump when the recipe changes: an env stamped with another recipe is rebuilt
TORCH_VERSION=2.13.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "vllm_env: $*" >&2; exit 1; }
[ $# -eq 1 ] && [ -n "$1" ] || die "usage: tools/vllm_env.sh RELEASE (e.g. 0.30.0rc2)"
RELEASE="$1"
[[ "$RELEASE" =~ ^[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9.+-]*$ ]] || die "not a release: $RELEASE"

ROOT="${AICPU_TILING_VLLM_ENVS:-$HOME/.cache/aicpu-tiling/vllm-envs}"
CACHE="${AICPU_TILING_WHEELS:-$HOME/.cache/aicpu-tiling/wheels}"
PY="${AICPU_TILING_PYTHON:-python3}"
ROOT="$(realpath -m "$ROOT")"; CACHE="$(realpath -m "$CACHE")"   # the steps run in $ROOT
ENV="$ROOT/$RELEASE"
STAMP="$ENV/READY.json"
START=$(date +%s)
LOCK="$HERE/vllm-env-locks/$RELEASE.txt"
if [ -n "${AICPU_TILING_VLLM_UNLOCKED:-}" ] || [ ! -f "$LOCK" ]; then LOCK=""; fi
LOCK_SHA=$([ -n "$LOCK" ] && sha256sum "$LOCK" | cut -c1-16 || echo none)

env_size() { du -sh "$ENV" 2>/dev/null | cut -f1; }

mkdir -p "$ROOT" || die "cannot create $ROOT"
# Every step from here, where no package's metadata lies: the venv's python and pip put the
# working directory on sys.path, and a checkout's aicpu_tiling.egg-info there would count as
# installed (it reached a freeze.txt once, and pip would uninstall it from the checkout).
cd "$ROOT" || die "cannot enter $ROOT"
exec 9>"$ROOT/.$RELEASE.lock"
flock -w 3600 9 || die "another build of $RELEASE holds $ROOT/.$RELEASE.lock"

# The NPU twin's .pth (pyruntime/npu_twin/pth.py) in the venv's site-packages: idempotent,
# seconds, run on every call (a cached env included). It runs this checkout's module with
# the venv's interpreter; the file it writes names no checkout (PYTHONPATH picks one).
install_twin_pth() {
    env -u AICPU_TILING_TWIN -u AICPU_TILING PYTHONPATH="$HERE/.." "$ENV/venv/bin/python" \
        -m pyruntime.npu_twin.pth install >&2 \
        || die "cannot install the NPU twin's .pth into $ENV/venv"
}

if [ -f "$STAMP" ]; then
    if grep -q "\"recipe\": $RECIPE," "$STAMP" && [ -x "$ENV/venv/bin/python" ] \
            && { [ -z "$LOCK" ] || grep -q "\"lock\": \"$LOCK_SHA\"" "$STAMP"; }; then
        install_twin_pth
        echo "vllm_env: $RELEASE ready (cached) at $ENV: $(( $(date +%s) - START )) s, $(env_size)"
        exit 0
    fi
    echo "vllm_env: $STAMP is from another recipe or lock, or incomplete: rebuilding" >&2
    rm -rf "$ENV"
fi
# --- 1. archives ----------------------------------------------------------------
ascend_tar="$CACHE/vllm_ascend-$RELEASE.tar.gz"
if [ ! -f "$ascend_tar" ]; then
    "$PY" "$HERE/fetch_sdists.py" "$CACHE" vllm-ascend "$RELEASE" >&2 \
        || die "no vllm-ascend $RELEASE sdist in $CACHE and fetching it failed"
fi
mkdir -p "$ENV/logs" "$ENV/.steps" || die "cannot create $ENV"

VPY="$ENV/venv/bin/python"
TREE="$ENV/vllm-ascend"
CONSTRAINTS="$ENV/constraints.txt"

# run_step NAME COMMAND...: run once (marker in .steps/), output in logs/NAME.log
run_step() {
    local name="$1"; shift
    [ -f "$ENV/.steps/$name" ] && return 0
    local t0; t0=$(date +%s)
    printf 'vllm_env: %-14s ... ' "$name" >&2
    # a subshell outside any `if`, so that `set -e` holds inside the step function
    ( set -e; "$@" ) >"$ENV/logs/$name.log" 2>&1
    if [ $? -eq 0 ]; then
        echo "$(( $(date +%s) - t0 ))" >"$ENV/.steps/$name"   # seconds it took
        echo "$(( $(date +%s) - t0 )) s" >&2
    else
        echo "FAILED" >&2
        die "step $name failed after $(( $(date +%s) - t0 )) s: $(grep -E -i 'error|failed|no such|cannot' "$ENV/logs/$name.log" | tail -n 1 | cut -c1-200) (log: $ENV/logs/$name.log)"
    fi
}

pip_() { "$VPY" -m pip --disable-pip-version-check "$@"; }


step_source() {
    set -e
    rm -rf "$TREE" "$ENV/src.tmp"
    mkdir -p "$ENV/src.tmp"
    tar -xzf "$ascend_tar" -C "$ENV/src.tmp"
    local top; top=$(ls "$ENV/src.tmp")
    if [ "$(echo "$top" | wc -l)" -ne 1 ] || [ ! -d "$ENV/src.tmp/$top/vllm_ascend" ]; then
        echo "error: unexpected archive layout: $top"; return 1
    fi
    mv "$ENV/src.tmp/$top" "$TREE"
    rmdir "$ENV/src.tmp"
    # what setup.py's gen_build_info writes for SOC_VERSION=ascend910b1 (their CPU UT CI)
    printf '# Written by tools/vllm_env.sh (setup.py gen_build_info, SOC_VERSION=ascend910b1)\n__device_type__ = %s\n__soc_version__ = %s\n' \
        "'A2'" "'ascend910b1'" >"$TREE/vllm_ascend/_build_info.py"
    # distribution metadata, as an install would write it (version + entry points)
    local di="$TREE/vllm_ascend-$RELEASE.dist-info"
    mkdir -p "$di"
    if [ -f "$TREE/PKG-INFO" ]; then cp "$TREE/PKG-INFO" "$di/METADATA"; else
        printf 'Metadata-Version: 2.1\nName: vllm-ascend\nVersion: %s\n' "$RELEASE" >"$di/METADATA"; fi
    grep -q "^Version: $RELEASE\$" "$di/METADATA"
    if [ -f "$TREE/vllm_ascend.egg-info/entry_points.txt" ]; then
        cp "$TREE/vllm_ascend.egg-info/entry_points.txt" "$di/entry_points.txt"; fi
    echo "tools/vllm_env.sh" >"$di/INSTALLER"
    rm -rf "$TREE/vllm_ascend.egg-info"   # one metadata source only
}
run_step source step_source

# The vLLM release this vllm-ascend release pins.
VLLM_VERSION="${AICPU_TILING_VLLM_VERSION:-}"
if [ -z "$VLLM_VERSION" ] && [ -f "$TREE/.github/vllm-release-tag.commit" ]; then
    VLLM_VERSION=$(tr -d '[:space:]' <"$TREE/.github/vllm-release-tag.commit")
fi
if [ -z "$VLLM_VERSION" ] && [ -f "$TREE/Dockerfile" ]; then
    VLLM_VERSION=$(sed -n 's/^ARG VLLM_TAG=//p' "$TREE/Dockerfile" | head -n 1 | tr -d '[:space:]')
fi
VLLM_VERSION="${VLLM_VERSION#v}"
[[ "$VLLM_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9.]*$ ]] \
    || die "cannot tell which vLLM $RELEASE pins (got '$VLLM_VERSION'); set AICPU_TILING_VLLM_VERSION"

vllm_tar="$CACHE/vllm-$VLLM_VERSION.tar.gz"
if [ ! -f "$vllm_tar" ]; then
    "$PY" "$HERE/fetch_sdists.py" "$CACHE" vllm "$VLLM_VERSION" >&2 \
        || die "no vllm $VLLM_VERSION sdist in $CACHE and fetching it failed"
fi

# --- 2. venv and torch --------------------------------------------------------------
step_venv() {
    set -e
    rm -rf "$ENV/venv"
    "$PY" -m venv "$ENV/venv"
    # Never a CUDA torch, never a real torchvision/torch_npu: every install below uses this.
    printf 'torch==%s\ntorchvision<0\ntorch-npu<0\ntorch_npu<0\n' "$TORCH_VERSION" >"$CONSTRAINTS"
}
run_step venv step_venv

step_torch() {
    set -e
    pip_ install -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
    "$VPY" -c "import torch,sys; v=torch.__version__; print(v, torch.version.cuda); sys.exit(0 if v.split('+')[0]=='$TORCH_VERSION' and torch.version.cuda is None else 1)"
}
run_step torch step_torch

# torchvision stand-in: the PyPI torchvision wheel is built against CUDA torch and fails to
# import beside the CPU torch. Imports at module level, found by grep in vLLM 0.23/0.30,
# transformers 5.x and vLLM-Ascend: torchvision.transforms (as T / transforms,
# InterpolationMode, v2, functional, v2.functional as tvF), torchvision.io (ImageReadMode,
# decode_image, read_image), torchvision.ops(.boxes). transformers 5 finds torchvision with
# importlib.util.find_spec and then builds {PIL mode: InterpolationMode.X} at import, so the
# enums are real; every other name is a placeholder that raises when called.
step_torchvision() {
    set -e
    local sp; sp=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    local tv="$sp/torchvision"
    [ -n "$sp" ] && [ -d "$sp" ] || { echo "error: no site-packages"; return 1; }
    rm -rf "$tv"; mkdir -p "$tv/transforms/v2" "$tv/io" "$tv/ops"
    cat >"$tv/_stub.py" <<'STUB_END'
"""Stand-in for torchvision in a CPU test env (tools/vllm_env.sh): imports work, calls raise."""
import enum


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4
    RGBA = 4


def _unavailable(qualname):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{qualname}: torchvision is a stand-in in this environment")

    class Placeholder:
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs

        __call__ = staticmethod(fail)

    Placeholder.__name__ = Placeholder.__qualname__ = qualname.rsplit(".", 1)[-1]
    # CamelCase names are transform classes (some modules build them at import);
    # lower-case names are functions.
    return Placeholder if qualname.rsplit(".", 1)[-1][:1].isupper() else fail


def module_getattr(module_name):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable(f"{module_name}.{name}")

    return __getattr__
STUB_END
    # stub_module FILE DOTS [SUBMODULES]: a module re-exporting the enums, placeholders else
    stub_module() {
        {
            echo "from $2_stub import InterpolationMode, ImageReadMode, module_getattr  # noqa: F401"
            [ -z "${3:-}" ] || echo "from . import $3  # noqa: F401,E402"
            echo "__getattr__ = module_getattr(__name__)"
        } >"$1"
    }
    {
        echo '"""torchvision stand-in (tools/vllm_env.sh); see torchvision/_stub.py."""'
        echo '__version__ = "0.28.0+stub"'
        echo 'from . import io, ops, transforms  # noqa: E402,F401'
    } >"$tv/__init__.py"
    stub_module "$tv/transforms/__init__.py" .. "functional, v2"
    stub_module "$tv/transforms/functional.py" ..
    stub_module "$tv/transforms/v2/__init__.py" ... functional
    stub_module "$tv/transforms/v2/functional.py" ...
    stub_module "$tv/io/__init__.py" ..
    stub_module "$tv/ops/__init__.py" .. boxes
    stub_module "$tv/ops/boxes.py" ..
    "$VPY" -c "
import torchvision, torchvision.transforms as T
from torchvision.transforms.v2 import functional as tvF
from torchvision.transforms.functional import InterpolationMode, pil_to_tensor
from torchvision.io import ImageReadMode, decode_image, read_image
from torchvision.ops.boxes import batched_nms
T.Compose([T.Resize(8)])
print('torchvision stand-in', torchvision.__version__, T.InterpolationMode.BICUBIC, ImageReadMode.RGB)"
}
run_step torchvision step_torchvision

# --- 3. vLLM from its sdist, no device ---------------------------------------------------
step_vllm() {
    set -e
    # vLLM's own build requirements (pyproject [build-system]) minus torch, then a build
    # without isolation against the torch above (its pyproject pins the torch it was
    # released with; the empty target compiles no torch extension).
    local reqs
    reqs=$("$VPY" - "$vllm_tar" <<'EOF'
import re, sys, tarfile, tomllib
with tarfile.open(sys.argv[1]) as tar:
    member = next(m for m in tar.getmembers() if re.fullmatch(r"[^/]+/pyproject\.toml", m.name))
    data = tomllib.load(tar.extractfile(member))
for r in data["build-system"]["requires"]:
    if re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() != "torch":
        print(r)
EOF
)
    echo "build requirements: $reqs"
    mapfile -t breqs <<<"$reqs"
    pip_ install -c "$CONSTRAINTS" "${breqs[@]}"
    # No Rust toolchain here (~/.cargo is left off PATH): vLLM's Rust frontend is optional
    # and would need crates.io, which is unreachable.
    env PATH="$ENV/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        VLLM_TARGET_DEVICE=empty MAX_JOBS="$(nproc)" CARGO_NET_OFFLINE=true \
        "$VPY" -m pip --disable-pip-version-check install --no-build-isolation \
        -c "$CONSTRAINTS" "$vllm_tar"
    "$VPY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}
run_step vllm step_vllm

# --- 4. vLLM-Ascend's requirements and the test tools --------------------------------------
step_ascend_deps() {
    set -e
    # requirements.txt minus: torch (pinned above), torch-npu/torchvision/torchaudio (NPU or
    # CUDA builds), triton-ascend and memfabric/memcache_hybrid (Ascend-only native), and
    # arctic-inference (a vLLM plugin of its own); the build-only tools are harmless.
    # From requirements-dev.txt: the pytest plugins the unit tests use.
    "$VPY" - "$TREE" >"$ENV/ascend-requirements.txt" <<'EOF'
import re, sys
from pathlib import Path
tree = Path(sys.argv[1])
skip = {"torch", "torch-npu", "torchvision", "torchaudio", "triton-ascend", "triton",
        "memfabric-hybrid", "memcache-hybrid", "arctic-inference"}
def name(line):
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]).lower()
def lines(path):
    for raw in (tree / path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            yield line
out = [l for l in lines("requirements.txt") if name(l) not in skip]
out += [l for l in lines("requirements-dev.txt") if name(l).startswith("pytest") and name(l) != "pytest-cov"]
print("\n".join(dict.fromkeys(out)))
EOF
    cat "$ENV/ascend-requirements.txt"
    pip_ install -c "$CONSTRAINTS" -r "$ENV/ascend-requirements.txt"
    # Their CPU UT job uninstalls triton after installing vLLM (tests/ut/conftest.py mocks
    # triton.runtime); some requirement may have brought it in.
    if pip_ show triton >/dev/null 2>&1; then pip_ uninstall -y triton; fi
    # vLLM's step installed the newest transformers and what it requires; the release's pin
    # then replaced transformers, leaving those behind. HF's `kernels` is one: transformers
    # >= 5.x (newest: 5.25) requires it, 5.5.4 (0.23.0.post1's pin) lists it only as an extra
    # (kernels<0.13) yet imports it when present, and kernels 0.19 makes that import raise
    # ("Either a revision or a version must be specified", transformers.activations), which
    # stopped every vLLM import of a fresh 0.23.0.post1 env on 2026-12-06. Left with nothing
    # that requires it, it goes, as an install of the pinned transformers alone would have it.
    if pip_ show kernels 2>/dev/null | grep -q '^Required-by: *$'; then
        pip_ uninstall -y kernels
    fi
    pip_ check || echo "pip check reports conflicts (kept, as in vLLM-Ascend's CI install order)"
}
run_step ascend-deps step_ascend_deps

# --- 5. what aicpu-tiling's own code needs there: the NPU twin (ziglang builds the AArch64
# AI-CPU binary, unicorn runs it, pyelftools reads it) and triton, which our NPU engine
# requires for its AI Core kernels (Triton-Ascend on a device). vLLM-Ascend's CPU UT job
# runs without triton; its default unit tests give the same outcomes with it (checked by
# tools/run_vllm_ascend_ut.py, whose JSON records the venv).
step_twin() {
    set -e
    pip_ install -c "$CONSTRAINTS" "ziglang>=0.17" "unicorn>=2.1.4" "pyelftools>=0.33" \
        "triton==3.9.0" cffi numpy rich packaging
}
run_step twin step_twin

# --- 6. the lock: every package at the version of an env the whole suite passed in ---------
step_lock() {
    set -e
    if [ -z "$LOCK" ]; then
        echo "no lock for $RELEASE (or AICPU_TILING_VLLM_UNLOCKED set): as resolved"; return 0
    fi
    # the lock never names torch, vLLM or pip (tests/test_vllm_env_lock.py)
    echo "lock: $LOCK ($(grep -c . "$LOCK") pins)"
    # exact versions, no resolution: what is already at its version stays
    pip_ install --no-deps -r "$LOCK"
    # what today's resolution added and the lock does not name goes
    local extra
    extra=$("$VPY" - "$LOCK" <<'EOF'
import re, sys
from importlib import metadata
def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
locked = {norm(line.split("==")[0]) for line in open(sys.argv[1]) if "==" in line}
keep = locked | {"torch", "vllm", "pip"}
print(" ".join(sorted({d.metadata["Name"] for d in metadata.distributions()
                       if norm(d.metadata["Name"]) not in keep})))
EOF
)
    if [ -n "$extra" ]; then
        echo "not in the lock, removed: $extra"
        # shellcheck disable=SC2086  # one word per package
        pip_ uninstall -y $extra
    fi
}
run_step lock step_lock

step_verify() {
    set -e
    # vLLM imports on its own (the tree's entry points would activate the Ascend platform,
    # which imports torch_npu: only tests/ut/conftest.py's mocks make that work)
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$VPY" -c "
import importlib.util, torch, vllm, pytest, transformers
import transformers.activations, vllm.config  # what vLLM's config imports of transformers
assert importlib.util.find_spec('torch_npu') is None, 'torch_npu must not be installed'
assert torch.version.cuda is None, 'torch is not the CPU build'
print('torch', torch.__version__, 'vllm', vllm.__version__, 'pytest', pytest.__version__)"
    PYTHONPATH="$TREE" "$VPY" -c "
import importlib.metadata as md, sys
v = md.version('vllm-ascend'); print('vllm-ascend', v); sys.exit(v != '$RELEASE')"
}
run_step verify step_verify


install_twin_pth
ELAPSED=$(( $(date +%s) - START ))
BUILD_S=$(cat "$ENV"/.steps/* | awk '{s += $1} END {print s + 0}')   # all steps, all calls
versions=$(PYTHONPATH="$TREE" "$VPY" -c "import importlib.metadata as m; print(' '.join(f'{d}={m.version(d)}' for d in ('torch','vllm','vllm-ascend','transformers','pytest')))")
# what the venv holds (the tree's dist-info aside): the runner reports any later drift
"$VPY" -c "import importlib.metadata as m; print('\n'.join(sorted({f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()})))" >"$ENV/freeze.txt" \
    || die "cannot list the venv's distributions"
cat >"$STAMP" <<EOF
{"recipe": $RECIPE, "release": "$RELEASE", "vllm": "$VLLM_VERSION", "torch": "$TORCH_VERSION",
 "python": "$VPY", "tree": "$TREE", "built_in_s": $BUILD_S, "lock": "$LOCK_SHA",
 "versions": "$versions", "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
echo "vllm_env: $RELEASE ready at $ENV: built in $BUILD_S s (this call $ELAPSED s), $(env_size) on disk" \
     "(venv $(du -sh "$ENV/venv" | cut -f1), tree $(du -sh "$TREE" | cut -f1)); $versions"
