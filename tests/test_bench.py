"""The benchmark's synthetic checkpoints are real checkpoints: they load, and bf16 is rounded as
torch rounds it."""

import numpy as np
import pytest

import specbound
from specbound.bench import _to_bf16, write_bert_checkpoint, write_llama_checkpoint


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    x[:4] = [0.0, -0.0, 1.0, 3.140625]
    ours = _to_bf16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


def test_small_llama_checkpoint_analyses(tmp_path):
    folder, largest = write_llama_checkpoint(tmp_path / "llama", L=2, N=64, H=4, H_kv=2, d_ff=96)
    result = specbound.analyze(folder, threads=1)
    assert result.model["family"] == "llama" and result.model["H_kv"] == 2 and result.model["L"] == 2
    assert set(result.matrices["role"]) == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}
    layer_params = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 96 + 2 * 64
    assert largest >= 2 * layer_params  # bf16 payload plus the header


def test_small_bert_checkpoint_analyses(tmp_path):
    folder = write_bert_checkpoint(tmp_path / "bert", L=2, N=64, H=4, d_ff=128)
    dense = specbound.analyze(folder, threads=1, method="dense")
    fast = specbound.analyze(folder, threads=1)
    for name, value in dense.bounds.items():
        assert fast.bounds[name] == pytest.approx(value, rel=1e-9)
