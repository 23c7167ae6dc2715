"""Shared test set-up."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Run torch on one thread: the engine's tensors are small in tests, and on a busy
    2-core machine intra-op threads that get descheduled made tiny ops ~10x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
