"""The README's example runs as written, and its two set-up commands match .ci/run."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
CI = README.parent / ".ci" / "run"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_example_runs(capsys):
    blocks = python_blocks()
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})  # noqa: S102 - the point
    printed = capsys.readouterr().out
    assert "Segment(core=0, request=0" in printed
    assert "request 1: cu_seqlens_q runs past max_tokens" in printed


def test_ci_runs_the_readme_test_command():
    readme = README.read_text()
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q' in readme
    ci = CI.read_text()
    assert "torch==2.13.0" in ci and '-e ".[test]"' in ci
    assert re.search(r"^python3? -m pytest -q$", ci, flags=re.MULTILINE)


def test_the_first_screen_has_status_compatibility_and_both_quick_starts():
    from pyruntime.hook import engine, vllm_ascend_targets as targets

    top = "\n".join(README.read_text().splitlines()[:60])
    for needle in ("## Status", "## Compatibility", "selfcheck --backend npu -o selfcheck.json",
                   'pip install torch==2.13.0 -e ".[test]" && aicpu-tiling bench',
                   'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q',
                   "pip install --no-deps -e . && pip install"):
        assert needle in top, f"{needle!r} is not in the README's first 60 lines"
    # the compatibility table states the hook's own range and SoCs
    assert targets.BELOW == "0.31.0" and f"`>={targets.MINIMUM},<0.31`" in top
    assert all(f"`{soc}" in top for soc in engine.SUPPORTED_SOCS)


def test_every_npu_install_line_is_the_same():
    """The quick start repeats the NPU section's install; tests/test_install.py runs the latter."""
    lines = re.findall(r"pip install --no-deps -e \. && pip install [^#\n]*", README.read_text())
    assert len(lines) == 2 and len({line.strip() for line in lines}) == 1, lines


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def test_links_in_the_readme_and_docs_resolve():
    pages = [README, *sorted((README.parent / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_file():
                broken.append(f"{page.name}: {target} (no file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{page.name}: {target} (no heading)")
    assert broken == []
