"""The ``run_store`` fixture of the report tests: one run's checkpoints in a store (a test module
imports it to use it)."""

import pytest

from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store
from support.numpy_bert import write_tiny_bert

RUN_STEPS = (100, 200, 300, 1000)


@pytest.fixture(scope="session")
def run_store(tmp_path_factory):
    """Four checkpoints of one shape whose weights grow with the step, swept into a store."""

    root = tmp_path_factory.mktemp("run")
    for i, step in enumerate(RUN_STEPS):
        write_tiny_bert(root / "run" / f"step-{step}", seed=i, L=2, N=16, H=4, d_ff=24, std=0.1 * (1 + step / 200))
    report = run_sweep(
        expand_sources([str(root / "run" / "step-{step=100..1000..100}")]), root / "store", progress=False
    )
    assert len(report.written) == len(RUN_STEPS), report.summary()
    return Store(root / "store")
