"""The documentation builds offline with every tutorial executed (so CI catches breakage)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_documentation_builds_with_tutorials(tmp_path):
    pytest.importorskip("sphinx_gallery", reason="doc extras not installed (make test "
                                                 "installs them)")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going",
                           "-q", "-d", str(tmp_path / "doctrees"), str(ROOT / "doc"),
                           str(tmp_path / "html")], capture_output=True, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg", "MLEM_DOC_RUN_ALL": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    html = tmp_path / "html"
    tutorials = sorted((ROOT / "tutorials").glob("plot_*.py"))
    assert tutorials
    for t in tutorials:
        page = html / "auto_tutorials" / f"{t.stem}.html"
        assert page.exists(), f"{t.name} was not rendered"
        assert "sphx-glr-script-out" in page.read_text() or "<img" in page.read_text()
    for page in ("index", "install", "method", "options", "performance", "whats_new",
                 "changelog", "api"):
        assert (html / f"{page}.html").exists()
