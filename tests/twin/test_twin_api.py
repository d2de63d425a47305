"""The twin's torch_npu surface against the real wheel (read as a zip, never installed): the
FIA schemas it defines, and every ``torch.npu`` name the NPU backend uses."""

from __future__ import annotations

import re
import zipfile

import pytest

from pyruntime.backends.npu import TORCH_NPU_API
from pyruntime.npu_twin import fia, npu_module
from tests.wheels import TORCH_NPU_WHEEL, cached_wheel


@pytest.fixture(scope="module")
def plugin_docs() -> str:
    with zipfile.ZipFile(cached_wheel(TORCH_NPU_WHEEL)) as wheel:
        return wheel.read("torch_npu/_op_plugin_docs.py").decode()


@pytest.mark.parametrize("schema", [fia.SCHEMA, fia.OUT_SCHEMA], ids=["functional", "out"])
def test_fia_schemas_are_the_wheels(schema, plugin_docs):
    name = schema.split("(", 1)[0]
    prototypes = re.findall(rf"^torch_npu\.{re.escape(name)}\((.*)$", plugin_docs, re.MULTILINE)
    assert prototypes, f"the wheel documents no {name}"
    assert schema in [f"{name}({p.rstrip()}" for p in prototypes]


def test_every_torch_npu_name_the_backend_uses_is_implemented_by_the_twin():
    defined = vars(npu_module)  # what the module defines (its __getattr__ makes placeholders)
    missing = []
    for path in TORCH_NPU_API:
        name, *member = path.split(".")[2:]  # after torch.npu
        if name not in defined or (member and not hasattr(defined[name], member[0])):
            missing.append(path)
    assert not missing, f"the twin only has placeholders for {missing}"
