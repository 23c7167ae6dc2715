"""Set-up for the tests in this folder.

The fixtures every test and every doctest share (torch on one thread) are in the
repository's top-level ``conftest.py``, so that ``pytest mlem_neuro`` (the doctests alone)
gets them too.
"""
import os

# figures are drawn off-screen (README examples, result.plot tests)
os.environ.setdefault("MPLBACKEND", "Agg")
