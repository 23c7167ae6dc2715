"""pytest plugin: run the CUDA tests on an emulated CUDA device (``tests/fake_cuda.py``).

    python -m pytest -p fake_cuda_plugin tests/test_cuda.py      (PYTHONPATH=tests)

``torch.cuda.is_available()`` is true from ``pytest_configure`` on, so the tests' "needs a
CUDA GPU" marks evaluate as on a GPU machine, and every test runs inside
:func:`fake_cuda.fake_cuda`.  ``tests/test_fake_cuda.py`` runs it.
"""
import pytest
import torch
from fake_cuda import fake_cuda, patched_cuda_module


def pytest_configure(config):
    """Report one GPU from now on (before the test files, and their marks, are imported).

    A hook, not import-time code: the doctest collection of ``tests/`` imports this file
    too, and must not change ``torch.cuda`` for the rest of the suite."""
    if torch.cuda.is_available():  # pragma: no cover
        raise pytest.UsageError("a real CUDA device is present: run the CUDA tests without "
                                "-p fake_cuda_plugin")
    config._fake_cuda = patched_cuda_module()
    config._fake_cuda.__enter__()


def pytest_unconfigure(config):
    if getattr(config, "_fake_cuda", None) is not None:
        config._fake_cuda.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def _emulated_cuda():
    with fake_cuda():
        yield
