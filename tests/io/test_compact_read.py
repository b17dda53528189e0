"""Feed-forward matrices read as stored (``Checkpoint.read(name, compact=True)``): float32 where it holds
the stored values exactly (F32, F16, BF16 safetensors), float64 otherwise, the same values and checks
as the float64 read."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from specbound import SpecboundError
from specbound.io import open_checkpoint
from specbound.pipeline import open_model, read_layer
from specbound.tools.bench import write_llama_checkpoint


def _saved(folder, w):
    save_file({"w": w}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    return open_checkpoint(folder)


@pytest.mark.parametrize(
    "dtype, compact_dtype", [(np.float32, np.float32), (np.float16, np.float32), (np.float64, np.float64)]
)
def test_a_safetensors_tensor_read_compact_holds_the_same_values(tmp_path, dtype, compact_dtype):
    w = (np.random.default_rng(0).standard_normal((24, 40)) * 0.02).astype(dtype)
    ckpt = _saved(tmp_path, w)
    full, compact = ckpt.read("w"), ckpt.read("w", compact=True)
    assert full.dtype == np.float64 and compact.dtype == compact_dtype
    np.testing.assert_array_equal(compact.astype(np.float64), full)
    np.testing.assert_array_equal(full, w.astype(np.float64))


def test_a_compact_read_refuses_nan_like_the_float64_one(tmp_path):
    w = np.ones((4, 6), dtype=np.float16)
    w[2, 3] = np.nan
    ckpt = _saved(tmp_path, w)
    for compact in (False, True):
        with pytest.raises(SpecboundError, match=r"holds 1 NaN/Inf value"):
            ckpt.read("w", compact=compact)


def test_a_bf16_layer_gives_its_feed_forward_matrices_as_stored(tmp_path):
    folder, _ = write_llama_checkpoint(tmp_path / "llama", L=1, N=64, H=4, H_kv=2, d_ff=96, vocab=64)
    model = open_model(folder)
    ff = read_layer(model, 0).ff
    for role in ("FF_gate", "FF_up", "FF_out"):
        compact, full = ff.compact(role), ff[role]
        assert compact.dtype == np.float32 and full.dtype == np.float64 and compact.shape == full.shape
        np.testing.assert_array_equal(compact.astype(np.float64), full)
