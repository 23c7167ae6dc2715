"""The README's usage example runs as written, and the demo command works."""
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_usage_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    namespace = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    est, imp = namespace["est"], namespace["imp"]
    assert est.W_.shape == (6, 6)
    assert np.linalg.norm(est.W_) == pytest.approx(1.0)
    assert len(imp) == 21                      # 6 features + 15 interactions
    assert namespace["est"].score(namespace["X"][100:], namespace["y"][100:]) > 0.3


def test_demo_command_prints_comparison(capsys):
    from mlem_neuro.__main__ import main

    assert main(["demo", "--stimuli", "40", "--features", "3", "--units", "20"]) == 0
    out = capsys.readouterr().out
    assert "MLEM" in out and "FR-RSA-I" in out and "Top permutation importances" in out
    with pytest.raises(SystemExit):
        main(["demo", "--stimuli", "2"])
