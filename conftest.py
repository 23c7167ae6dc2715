"""pytest set-up shared by the test suite (tests/) and the package's doctests (mlem_neuro/)."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Run torch on one thread, for tests and doctests alike.

    The engine's tensors are small in tests, and on a busy 2-core machine intra-op threads
    that get descheduled made tiny ops ~10x slower.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
