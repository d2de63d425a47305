"""tools/readme_headline.py: the README's one regenerated headline table."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "readme_headline.py"
spec = importlib.util.spec_from_file_location("readme_headline", TOOL)
headline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headline)


def result(**changes) -> dict:
    out = {"version": 4, "command": "aicpu-tiling bench", "created": "2026-12-02T07:16:10+0000",
           "environment": {"cpus": 2, "torch": "2.13.0+cpu"}, "config": {"steps": 30},
           "headline": {"host_update_us": 2826.2, "device_tiling_us": 20.6, "host_ratio": 137.2,
                        "pre_replay_us": 34.3, "host_ratio_pre_replay": 82.4},
           "host_flatness": {"steps": 30, "modes": {
               "device_tiling": {"ratio": {"value": 1.04, "ci": [0.9, 1.2]}},
               "pre_replay": {"ratio": {"value": 1.41, "ci": [1.3, 1.5]}}}}}
    out.update(changes)
    return out


def test_the_block_carries_each_figure_of_the_result():
    block = headline.render(result())
    assert "| host_update | 2,826.2 | - | - |" in block
    assert "| device tiling, `graph` | 20.6 | 137x | 1.04 (0.90-1.20) |" in block
    assert "| device tiling, `pre-replay` | 34.3 | 82x | 1.41 (1.30-1.50) |" in block
    assert "`aicpu-tiling bench`, 2026-12-02, 2 CPUs" in block


@pytest.mark.parametrize("bad", [{"version": 2}, {"version": 5}, {"headline": None},
                                 {"host_flatness": None}])
def test_a_result_without_the_headline_or_the_flatness_run_is_refused(bad):
    with pytest.raises(headline.HeadlineError, match="default grid"):
        headline.render(result(**bad))


def test_the_readme_has_one_block_and_only_it_is_replaced():
    readme = headline.README.read_text()
    assert readme.count(headline.BEGIN) == readme.count(headline.END) == 1
    new = headline.replace_block(readme, "NEW")
    assert f"{headline.BEGIN}\nNEW\n{headline.END}" in new
    before, after = readme.split(headline.BEGIN)[0], readme.split(headline.END)[1]
    assert new.startswith(before) and new.endswith(after)
    with pytest.raises(headline.HeadlineError):
        headline.replace_block("no markers here", "NEW")
