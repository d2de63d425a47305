"""The runnable examples in the public docstrings stay runnable."""

import textwrap

import pytest

import pyruntime.attention
import pyruntime.backends


@pytest.mark.parametrize("module", [pyruntime.backends, pyruntime.attention],
                         ids=lambda m: m.__name__)
def test_docstring_example_runs(module):
    example = textwrap.dedent(module.__doc__.split("::\n", 1)[1])
    scope = {}
    exec(compile(example, module.__name__, "exec"), scope)  # noqa: S102 - our own docstring
    if module is pyruntime.attention:
        assert scope["outs"][0][3:].abs().max() == 0  # padding rows are zero
        assert scope["outs"][0][:3].abs().max() > 0
    else:
        assert scope["x"].tolist() == [2.0, 2.0, 2.0, 2.0]
