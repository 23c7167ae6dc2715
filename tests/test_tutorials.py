"""Every tutorial script runs end to end (Agg backend), so a broken tutorial fails CI."""
import runpy
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("plot_*.py"))


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path):
    import matplotlib.pyplot as plt

    runpy.run_path(str(path), run_name="__main__")
    assert plt.get_fignums(), "a tutorial should produce at least one figure"
    plt.close("all")
