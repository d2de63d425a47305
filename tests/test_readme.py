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


#: the README's two set-up commands, as CI runs them
BENCH_COMMAND = "pip install torch==2.13.0 -e . && aicpu-tiling bench --quick"
TEST_COMMAND = 'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q'
#: for machines without torch: the CPU build from PyTorch's CPU wheel index
CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"


def _quick_start_commands() -> list[str]:
    """The commands of the README's quick-start block (the one with the test command)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    (block,) = [b for b in blocks if TEST_COMMAND in b]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_commands_exactly():
    """The bench installs with the base package (no test extra) and runs --quick; CI runs both
    README commands as written, each as a line of .ci/run."""
    assert _quick_start_commands() == [BENCH_COMMAND, TEST_COMMAND]
    ci_lines = CI.read_text().splitlines()
    for command in (BENCH_COMMAND, TEST_COMMAND):
        assert command in ci_lines, command
    assert CPU_TORCH in README.read_text().splitlines()   # its own line, outside that block
    assert CPU_TORCH not in "\n".join(_quick_start_commands())


def test_the_readme_says_how_long_the_install_takes_and_what_it_downloads():
    top = README.read_text().split("## On an Ascend NPU")[0]
    assert re.search(r"The first install takes about \d+ s", top)
    assert "downloads numpy, cffi, rich" in top and "test extra" in top


def test_the_first_screen_says_who_it_is_for_and_what_they_gain():
    first = "\n".join(README.read_text().splitlines()[:20])
    assert "**For**" in first and "**What you gain if it works" in first


def test_compatibility_cells_are_short_with_details_one_link_away():
    readme = README.read_text()
    table = readme[readme.index("## Compatibility"):readme.index("## Quick start")]
    cells = [c.strip() for row in table.splitlines() if row.startswith("|")
             for c in row.strip("|").split("|")]
    assert cells and max(len(c) for c in cells) <= 130, max(cells, key=len)
    assert "docs/compatibility.md" in table


def test_license_file_is_the_one_pyproject_names():
    import tomllib

    license_text = (README.parent / "LICENSE").read_text()
    named = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["license"]
    assert named == {"text": "Apache-2.0"}
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text) > 10000


def test_the_first_screen_has_status_compatibility_and_both_quick_starts():
    from pyruntime.hook import engine, vllm_ascend_targets as targets

    top = "\n".join(README.read_text().splitlines()[:75])
    for needle in ("## Status", "## Compatibility", "selfcheck --backend npu -o selfcheck.json",
                   BENCH_COMMAND, TEST_COMMAND, "pip install --no-deps -e . && pip install"):
        assert needle in top, f"{needle!r} is not in the README's first 75 lines"
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
