"""Tiny random BERT-family checkpoints saved by `transformers` itself: the analysis equals the
independent dense oracle (tests/support/oracle.py) to 1e-9 relative, whatever the tensor-name prefix, the
sharding or the stored precision."""

import json

import numpy as np
import pandas as pd
import pytest
from safetensors import safe_open
from support.oracle import dense_reference

import specbound

REL = 1e-9
COLUMNS = [
    "rank",
    "spectral_norm",
    "frobenius_norm",
    "nuclear_norm",
    "stable_rank",
    "norm_2_1",
    "norm_1_1",
    "downstream_factor",
    "gamma",
    "p_star",
    "contribution",
    "c_p0",
    "c_p2",
]


def assert_matches_oracle(analysis, bounds, rows):
    ref = pd.DataFrame(rows)
    ours = analysis.matrices
    assert len(ours) == len(ref)
    assert list(ours["role"]) == list(ref["role"])
    assert list(ours["layer"]) == list(ref["layer"])
    assert [None if pd.isna(h) else int(h) for h in ours["head"]] == [r["head"] for r in rows]
    for col in COLUMNS:
        np.testing.assert_allclose(ours[col].to_numpy(float), ref[col].to_numpy(float), rtol=REL, err_msg=col)
    for name in ("spectral_adaptive", "edelman"):
        assert analysis.bounds[name] == pytest.approx(bounds[name], rel=REL), name


def tensor_names(folder):
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        return list(f.keys())


CASES = [  # fixture, name prefix in the file, L, N, H, d_ff
    ("tiny_bert_dir", "", 2, 32, 4, 48),
    ("tiny_bert_cls_dir", "bert.", 3, 48, 4, 80),
    ("tiny_roberta_dir", "roberta.", 2, 64, 4, 96),
]


@pytest.mark.parametrize("fixture, prefix, L, N, H, d_ff", CASES, ids=[c[0] for c in CASES])
def test_matches_dense_oracle(request, fixture, prefix, L, N, H, d_ff):
    folder = request.getfixturevalue(fixture)
    names = tensor_names(folder)
    # the checkpoint really is stored under this prefix (and has head/pooler tensors besides)
    assert f"{prefix}encoder.layer.0.attention.self.query.weight" in names
    assert all(n.startswith(prefix) or not n.startswith("encoder.") for n in names)

    result = specbound.analyze(folder, threads=1)
    assert result.model["L"] == L and result.model["N"] == N and result.model["H"] == H
    assert result.model["d_ff"] == d_ff and result.model["d_head"] == N // H
    assert len(result.matrices) == L * (2 * H + 2)
    assert result.matrices["p_star"].nunique() > 1  # not every matrix in one corner of the grid
    assert_matches_oracle(result, *dense_reference(folder, prefix=prefix))


def test_roberta_model_type_uses_the_bert_spec(tiny_roberta_dir):
    assert json.loads((tiny_roberta_dir / "config.json").read_text())["model_type"] == "roberta"
    assert specbound.analyze(tiny_roberta_dir, threads=1).model["family"] == "bert"


def test_oracle_prefix_is_not_vacuous(tiny_bert_cls_dir):
    # the oracle reads the prefixed names: without the prefix it finds no layer tensor at all
    with pytest.raises(KeyError):
        dense_reference(tiny_bert_cls_dir, prefix="")


def test_sharded_equals_single_file(tiny_dir):
    single, sharded = tiny_dir("bert"), tiny_dir("bert", "sharded")
    files = sorted(p.name for p in sharded.iterdir())
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    shards = set(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values())
    assert len(shards) > 1 and shards <= set(files)

    a, b = specbound.analyze(single, threads=1), specbound.analyze(sharded, threads=1)
    assert a.model == b.model
    assert a.bounds == b.bounds
    pd.testing.assert_frame_equal(a.matrices, b.matrices, check_exact=True)
    pd.testing.assert_frame_equal(a.singular_values, b.singular_values, check_exact=True)


def test_fp16_is_upcast_to_float64(tiny_dir):
    fp16, fp32 = tiny_dir("bert", "fp16"), tiny_dir("bert")
    with safe_open(str(fp16 / "model.safetensors"), framework="numpy") as f:
        assert f.get_tensor("encoder.layer.0.attention.self.query.weight").dtype == np.float16
    result = specbound.analyze(fp16, threads=1)
    # the oracle upcasts the same fp16 values to float64 itself
    assert_matches_oracle(result, *dense_reference(fp16))
    # and it really read the fp16 values: close to the fp32 model's numbers, but not equal
    full = specbound.analyze(fp32, threads=1)
    np.testing.assert_allclose(result.matrices["spectral_norm"], full.matrices["spectral_norm"], rtol=1e-2)
    assert not np.array_equal(result.matrices["spectral_norm"], full.matrices["spectral_norm"])


def test_bf16_is_upcast_to_float64(tiny_dir, tmp_path):
    """numpy has no bfloat16; bf16 -> float32 is exact, so an fp32 copy made by torch is the reference."""
    import torch
    from safetensors.torch import load_file, save_file

    bf16 = tiny_dir("bert", "bf16")
    tensors = load_file(str(bf16 / "model.safetensors"))
    assert tensors["encoder.layer.0.attention.self.query.weight"].dtype == torch.bfloat16
    as_fp32 = tmp_path / "bf16-as-fp32"
    as_fp32.mkdir()
    save_file(
        {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, str(as_fp32 / "model.safetensors")
    )
    (as_fp32 / "config.json").write_text((bf16 / "config.json").read_text())

    result = specbound.analyze(bf16, threads=1)
    assert_matches_oracle(result, *dense_reference(as_fp32))
    assert result.bounds == specbound.analyze(as_fp32, threads=1).bounds
