"""Every shipped family: a tiny random model saved by transformers analyses to the same matrices as
a reference built by *calling the model's own modules* on identity inputs, so a wrong slice,
orientation, fused layout or key/value grouping fails here."""

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import json
import shutil

from support.families import (
    D_FF,
    FAMILIES,
    FAMILY_OF,
    HEAD_DIM,
    ROTARY,
    TOWER,
    H,
    N,
    build_family,  # noqa: E402
    num_layers,
    reference_matrices,
    save_family,
)

import specbound  # noqa: E402


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved_family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = save_family(request.param, folder)
    accessor = FAMILIES[request.param][1]
    model = model.double()  # the saved float32 weights, upcast exactly; references in float64
    get = accessor(model)
    kv = (
        get(0)["k"].shape[1] // (get(0)["q"].shape[1] // H) if "q" in get(0) else H
    )  # latent attention: H  # key/value heads as the module splits them
    return request.param, folder, reference_matrices(get, H, kv, num_layers(model))


def test_family_matches_module_reference(saved_family):
    family, folder, ref = saved_family
    result = specbound.analyze(folder, threads=1, tower=TOWER.get(family))
    mats = result.matrices
    assert list(mats["role"]) == [r for r, _, _ in ref]
    rotary = result.model.get("rotary") is not None
    assert rotary == (family in ROTARY)
    if rotary:  # every QK head is counted under the method it got, and the rows say which
        counts = result.model["rotary"]["qk_spectral_norm"]
        methods = mats[mats["role"] == "QK"]["sv_method"].value_counts()
        assert counts == {m: int(methods.get(f"rotary_{m}", 0)) for m in ("exact_over_offsets", "product_bound")}
        # a QK-norm head's row is its stacked factors, on which no rotation acts (docs/theory.md 3d)
        assert sum(counts.values()) == sum(1 for r, _, f in ref if r == "QK" and f is not None)
    sv = result.singular_values
    for (role, w, factors), (i, row) in zip(ref, mats.iterrows()):
        s = np.linalg.svd(w, compute_uv=False)
        if rotary and role == "QK" and factors is not None:  # every quantity holds at every offset, 0 included
            slack = 1 + 1e-12
            assert row["sv_method"] in ("rotary_exact_over_offsets", "rotary_product_bound")
            # the Horn envelope is s_i(W_Q^h) s_i(W_K^g) of the module's factors, to 1e-9
            env = np.linalg.svd(factors[0], compute_uv=False) * np.linalg.svd(factors[1], compute_uv=False)
            rows = sv[(sv["matrix"] == i) & (sv["kind"] == "horn_envelope")]
            np.testing.assert_allclose(np.sort(rows["sigma"].to_numpy())[::-1], env, rtol=1e-9)
            assert row["spectral_norm"] * slack >= s[0] and row["frobenius_norm"] * slack >= np.linalg.norm(w)
            assert row["norm_2_1"] * slack >= np.linalg.norm(w, axis=0).sum()
            assert row["norm_1_1"] * slack >= np.abs(w).sum()
            assert row["rank"] >= np.count_nonzero(s > 1e-10 * len(s) * max(s[0], 1))
            continue
        assert row["spectral_norm"] == pytest.approx(s[0], rel=1e-9), (family, role)
        assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-9), (family, role)
        assert row["nuclear_norm"] == pytest.approx(s[s > 1e-10 * len(s) * max(s[0], 1)].sum(), rel=1e-9)
        assert row["norm_2_1"] == pytest.approx(np.linalg.norm(w, axis=0).sum(), rel=1e-9), (family, role)
        assert row["norm_1_1"] == pytest.approx(np.abs(w).sum(), rel=1e-9), (family, role)
        assert row["rows"] == w.shape[0] and row["cols"] == w.shape[1]
    assert np.isfinite(result.bounds["spectral_adaptive"]) and result.bounds["spectral_adaptive"] > 0


def test_family_from_pytorch_bin(saved_family, tmp_path):
    """The same weights as a pytorch_model.bin (the saved names, as older checkpoints store them)."""

    from safetensors.torch import load_file

    family, folder, _ = saved_family
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    torch.save(load_file(str(folder / "model.safetensors")), tmp_path / "pytorch_model.bin")
    from_bin = specbound.analyze(tmp_path, threads=1, tower=TOWER.get(family))
    reference = specbound.analyze(folder, threads=1, tower=TOWER.get(family))
    assert from_bin.all_bounds() == reference.all_bounds()
    assert from_bin.matrices.equals(reference.matrices)
    # the pickle's tensors read under a lock
    in_threads = specbound.analyze(tmp_path, threads=1, jobs=2, tower=TOWER.get(family))
    assert in_threads.matrices.equals(reference.matrices)


def test_family_block_structure(saved_family):
    family, folder, _ = saved_family
    result = specbound.analyze(folder, threads=1, tower=TOWER.get(family))
    assert result.model["family"] == FAMILY_OF.get(family, family)
    assert result.model["d_head"] == HEAD_DIM.get(family, result.model["N"] // result.model["H"])
    if family == "albert":  # 4 depths sharing 2 stored groups: every depth analysed, pairs identical
        assert result.model["L"] == 4 and set(result.matrices["layer"]) == {0, 1, 2, 3}
        by_layer = result.matrices.groupby("layer")["spectral_norm"].apply(list)
        assert by_layer[0] == by_layer[1] and by_layer[2] == by_layer[3] and by_layer[0] != by_layer[2]
    if family in ("llama", "mistral", "qwen2"):
        assert result.model["H_kv"] == 2 and set(result.matrices["role"]) == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}


def test_kv_heads_inferred_when_config_omits_them(tmp_path):
    """Mistral/Qwen2 configs may omit num_key_value_heads (library defaults 8 and 32, not H): the
    key weight's shape decides, and the numbers equal those with the key present."""

    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(
        transformers.MistralConfig(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            num_key_value_heads=2,
            intermediate_size=D_FF,
            vocab_size=50,
        )
    )
    model.save_pretrained(tmp_path)
    with_key = specbound.analyze(tmp_path, threads=1)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    without = specbound.analyze(tmp_path, threads=1)
    assert without.model["H_kv"] == 2
    assert without.bounds == with_key.bounds


def test_shared_count_equals_headline_without_sharing_and_never_exceeds_it(tmp_path):
    """spectral_shared (each stored matrix once, summed sensitivity) is the headline bound when no
    weights are shared, and at most the headline bound for an ALBERT, strictly below with sharing."""
    bert_folder = tmp_path / "bert"
    torch.manual_seed(1)
    transformers.BertModel(
        transformers.BertConfig(
            hidden_size=N, num_hidden_layers=3, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
        )
    ).save_pretrained(bert_folder)
    unshared = specbound.analyze(bert_folder, threads=1).all_bounds()
    assert unshared["spectral_shared"] == pytest.approx(unshared["spectral_adaptive"], rel=1e-12)

    for groups in (1, 2):
        folder = tmp_path / f"albert{groups}"
        torch.manual_seed(2)
        model = transformers.AlbertModel(
            transformers.AlbertConfig(
                embedding_size=16,
                hidden_size=N,
                num_hidden_layers=4,
                num_hidden_groups=groups,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
            )
        )
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
        model.save_pretrained(folder)
        bounds = specbound.analyze(folder, threads=1).all_bounds()
        assert bounds["spectral_shared"] < bounds["spectral_adaptive"]


def test_family_layers_in_parallel_are_identical(saved_family):
    """jobs > 1 analyses layers in threads: the same numbers in the same order (ALBERT's shared
    layers included), whatever order the layers finish in."""
    family, folder, _ = saved_family
    one = specbound.analyze(folder, threads=1, tower=TOWER.get(family))
    seen = []
    many = specbound.analyze(
        folder, threads=1, jobs=3, tower=TOWER.get(family), progress=lambda done, total: seen.append((done, total))
    )
    assert many.all_bounds() == one.all_bounds()
    pd.testing.assert_frame_equal(many.matrices, one.matrices, check_exact=True)
    L = one.model["L"]
    assert seen[-1] == (L, L) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_building_without_transformers_initialisation_changes_no_buffer(saved_family):
    """build_family skips transformers' weight initialisation (it redraws every parameter anyway): the
    module's buffers and the names it saves are the same as a model initialised as transformers does."""
    from transformers.initialization import no_init_weights

    family = saved_family[0]
    layers = num_layers(build_family(family))
    torch.manual_seed(0)
    initialised = FAMILIES[family][0](layers)
    with no_init_weights():
        bare = FAMILIES[family][0](layers)
    assert list(initialised.state_dict()) == list(bare.state_dict())
    buffers = dict(bare.named_buffers())
    for name, value in initialised.named_buffers():
        assert torch.equal(value, buffers[name]), (family, name)
