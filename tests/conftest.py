import os

import pytest

# Tests pin BLAS to one thread: two processes on two cores otherwise thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def minilm_dir():
    from specbound.defaults import default_checkpoint

    return default_checkpoint()
