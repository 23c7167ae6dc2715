"""Set-up for the tests in this folder.

The fixtures every test and every doctest share (torch on one thread) are in the
repository's top-level ``conftest.py``, so that ``pytest mlem_neuro`` (the doctests alone)
gets them too.
"""
import os

# figures are drawn off-screen (README examples, result.plot tests)
os.environ.setdefault("MPLBACKEND", "Agg")


import pytest  # noqa: E402


@pytest.fixture
def watch_compiled(monkeypatch):
    """``watch(name, compiled=None)``: record what ``mlem_neuro.core.kernels.<name>``
    returns (``None`` where the compiled library was not used) in the list it returns;
    with ``compiled`` true, skip the test where numba is not installed (the test passes
    the switch itself, as a runtime does: ``compiled=``)."""
    from mlem_neuro.core import kernels

    def watch(name, compiled=None):
        if compiled and not kernels.built():
            pytest.skip("the compiled library is not built")
        seen = []
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name,
                            lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
        return seen

    return watch
