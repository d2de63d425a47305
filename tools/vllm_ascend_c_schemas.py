"""Write ``pyruntime/npu_twin/vllm_ascend_c_schemas.py``: the ``_C_ascend`` op schemas of
each supported vLLM-Ascend release, read from the ``csrc/torch_binding.cpp`` of its sdist (in
the wheel cache of ``tools/fetch_wheels.sh``) by the twin's own reader
(`pyruntime.npu_twin.vllm_ascend_c.read_torch_binding`, for the twin's SoC).
``tests/twin/test_vllm_ascend_c.py`` checks the written table against the sdists.

Usage: python tools/vllm_ascend_c_schemas.py [RELEASE ...]   (default: 0.23.0.post1 0.30.0rc2)
"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("0.23.0.post1", "0.30.0rc2")
CACHE = Path(os.environ.get("AICPU_TILING_WHEEL_CACHE",
                            Path.home() / ".cache" / "aicpu-tiling" / "wheels"))
OUT = REPO / "pyruntime" / "npu_twin" / "vllm_ascend_c_schemas.py"


def torch_binding(release: str, cache: Path = CACHE) -> str:
    """The text of `release`'s ``csrc/torch_binding.cpp`` from its cached sdist."""
    archive = cache / f"vllm_ascend-{release}.tar.gz"
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"vllm_ascend-{release}/csrc/torch_binding.cpp")
        if member is None:
            raise FileNotFoundError(f"{archive} has no csrc/torch_binding.cpp")
        return member.read().decode()


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from pyruntime.npu_twin.vllm_ascend_c import read_torch_binding

    releases = argv or list(RELEASES)
    table = {release: read_torch_binding(torch_binding(release)) for release in releases}
    OUT.write_text(
        '"""The ``_C_ascend`` op schemas of vLLM-Ascend\'s ``csrc/torch_binding.cpp``, per '
        "release,\nas built for the NPU twin's SoC (`pyruntime.npu_twin.vllm_ascend_c`). "
        "Generated: do not edit;\nmade by ``python tools/vllm_ascend_c_schemas.py`` from the "
        'sdists of ``tools/fetch_wheels.sh``."""\n\n'
        "# fmt: off\n"
        "SCHEMAS: dict[str, dict[str, str]] = {\n"
        + "".join(f"    {release!r}: {{\n"
                  + "".join(f"        {name!r}: {schema!r},\n" for name, schema in ops.items())
                  + "    },\n" for release, ops in table.items())
        + "}\n")
    for release, schemas in table.items():
        print(f"{release}: {len(schemas)} ops")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
