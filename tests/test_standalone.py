"""The repository stands alone: it carries its data and the documents it cites.

`.ci/run` proves the first by running the suite on a copy with nothing beside it; these
tests keep the cheap half of that promise everywhere, including an editable checkout.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pyruntime.workload import trace

REPO = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".c", ".h", ".cc", ".cpp", ".sh", ".toml", ".json", ".txt", ""}
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis",
             ".ruff_cache", ".cache"}  # fmt: skip
# ../shared, /work/shared, shared/data, or a path built from a "shared" component
OUTSIDE = re.compile(r"\.\./shared|/work/shared|shared/data|[\"']shared[\"']")


def _project_text_files():
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        skipped = set(parts) & SKIP_DIRS or any(p.endswith(".egg-info") for p in parts)
        if path.is_file() and not skipped and path.suffix in TEXT_SUFFIXES:
            yield path


def test_nothing_looks_outside_the_repository_for_files():
    hits = []
    for path in _project_text_files():
        if path != Path(__file__).resolve():
            text = path.read_text(errors="replace")
            hits += [f"{path.relative_to(REPO)}: {m}" for m in OUTSIDE.findall(text)]
    assert hits == []


def test_the_trace_and_its_attribution_are_package_data():
    data = Path(trace.__file__).parent / "data"
    assert (data / trace.TRACE_NAME).is_file() and (data / "ATTRIBUTION.md").is_file()
    attribution = (data / "ATTRIBUTION.md").read_text()
    assert "CC-BY 4.0" in attribution and "Splitwise" in attribution
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = pyproject["tool"]["setuptools"]["package-data"]["pyruntime.workload"]
    assert f"data/{trace.TRACE_NAME}" in declared and "data/ATTRIBUTION.md" in declared


def test_every_cited_document_is_in_the_repository():
    cited = set()
    sources = [REPO / "README.md", *sorted((REPO / "aicpu_kernels").rglob("*.h"))]
    for path in sources:
        text = path.read_text()
        assert not re.search(r"(?<![\w/])DESIGN\.md", text), f"{path.name} cites DESIGN.md"
        cited |= set(re.findall(r"docs/[\w.-]+\.md", text))
    assert "docs/design.md" in cited
    assert [c for c in sorted(cited) if not (REPO / c).is_file()] == []
    design = (REPO / "docs" / "design.md").read_text()
    assert "## 3. The tiling contract" in design  # the section the citations name
