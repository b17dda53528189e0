"""Two-tower models (CLIP, SigLIP): each tower a chain of its own, every matrix equal to a reference
built by calling the tower's own modules; both towers reported under a ``tower`` key; ``tower`` picks
one; a checkpoint of one tower alone (CLIPTextModel, SiglipVisionModel) is that tower."""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import shutil

from safetensors.numpy import load_file, save_file

import specbound  # noqa: E402
from specbound.archs import builtin_specs
from specbound.cli import main
from specbound.errors import SpecboundError  # noqa: E402
from specbound.pipeline import open_model

TEXT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    vocab_size=50,
    max_position_embeddings=16,
)
VISION = dict(
    hidden_size=24, num_hidden_layers=3, num_attention_heads=2, intermediate_size=40, image_size=8, patch_size=4
)
FAMILIES = {
    "clip": lambda: transformers.CLIPModel(
        transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16)
    ),
    "siglip": lambda: transformers.SiglipModel(transformers.SiglipConfig(text_config=TEXT, vision_config=VISION)),
}


def _proj(module, n):
    with torch.no_grad():
        return (module(torch.eye(n, dtype=torch.float64)) - module(torch.zeros(1, n, dtype=torch.float64))).numpy()


def tower_reference(tower_module, n, heads):
    """``[(layer, role, matrix)]`` of one tower's encoder, in the analysis' order."""
    d = n // heads
    rows = []
    for layer, block in enumerate(tower_module.encoder.layers):
        w = {
            r: _proj(getattr(block.self_attn, m), n) for r, m in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj"))
        }
        rows += [(layer, "QK", w["q"][:, h * d : (h + 1) * d] @ w["k"][:, h * d : (h + 1) * d].T) for h in range(heads)]
        rows += [(layer, "OV", w["v"][:, h * d : (h + 1) * d] @ w["o"][h * d : (h + 1) * d]) for h in range(heads)]
        rows += [
            (layer, "FF_in", _proj(block.mlp.fc1, n)),
            (layer, "FF_out", _proj(block.mlp.fc2, block.mlp.fc2.in_features)),
        ]
    return rows


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved(request, tmp_path_factory):
    torch.manual_seed(0)
    model = FAMILIES[request.param]().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model.double()


@pytest.fixture(scope="module")
def both(saved):
    return specbound.analyze(saved[1], threads=1)


def _assert_matches(analysis, ref):
    m = analysis.matrices
    assert list(zip(m["layer"], m["role"])) == [(l, r) for l, r, _ in ref]
    for (_, role, w), (_, row) in zip(ref, m.iterrows()):
        s = np.linalg.svd(w, compute_uv=False)
        assert row["spectral_norm"] == pytest.approx(s[0], rel=1e-9), role
        assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-9), role
        assert row["norm_2_1"] == pytest.approx(np.linalg.norm(w, axis=0).sum(), rel=1e-9), role
        assert row["norm_1_1"] == pytest.approx(np.abs(w).sum(), rel=1e-9), role


def test_both_towers_match_their_modules(saved, both):
    family, _, model = saved
    assert isinstance(both, specbound.TowerAnalyses) and list(both) == ["text", "vision"]
    for tower, module, cfg in (("text", model.text_model, TEXT), ("vision", model.vision_model, VISION)):
        a = both[tower]
        assert a.model["family"] == family and a.model["tower"] == tower
        assert (a.model["L"], a.model["N"], a.model["H"]) == (
            cfg["num_hidden_layers"],
            cfg["hidden_size"],
            cfg["num_attention_heads"],
        )
        _assert_matches(a, tower_reference(module, cfg["hidden_size"], cfg["num_attention_heads"]))
        assert "two_tower" in {x["name"] for x in a.assumptions if x["applies"]}
        assert np.isfinite(a.bounds["spectral_adaptive"])


def test_one_tower_is_the_same_analysis(saved, both):
    vision = specbound.analyze(saved[1], threads=1, tower="vision")
    assert isinstance(vision, specbound.Analysis)
    assert vision.all_bounds() == both["vision"].all_bounds()
    pd.testing.assert_frame_equal(vision.matrices, both["vision"].matrices, check_exact=True)


def test_outputs_carry_the_tower(saved, both, tmp_path, capsys):
    doc = json.loads(both.to_json())
    assert set(doc["towers"]) == {"text", "vision"} and doc["towers"]["vision"]["model"]["tower"] == "vision"
    table = both.tidy_table("matrices")
    assert list(table.columns[:2]) == ["tower", "source"] and set(table["tower"]) == {"text", "vision"}
    both.save(tmp_path / "out")
    back = specbound.TowerAnalyses.load(tmp_path / "out")
    assert back.all_bounds() == both.all_bounds()
    with pytest.raises(SpecboundError, match="TowerAnalyses.load"):
        specbound.Analysis.load(tmp_path / "out")
    assert specbound.Analysis.load(tmp_path / "out" / "text").all_bounds() == both["text"].all_bounds()
    assert main(["analyze", str(saved[1]), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "text.spectral_adaptive" in out and "vision.spectral_adaptive" in out
    assert main(["analyze", str(saved[1]), "--tower", "text", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["tower"] == "text"


def test_a_checkpoint_of_one_tower_is_that_tower(saved, both, tmp_path):
    """CLIPTextModel / SiglipVisionModel hold one tower's weights under the same names and a config of
    that tower alone (model_type clip_text_model, siglip_vision_model, ...)."""
    family, _, model = saved
    cls = {"clip": ("CLIPTextModel", "CLIPVisionModel"), "siglip": ("SiglipTextModel", "SiglipVisionModel")}[family]
    for tower, name, config in (
        ("text", cls[0], model.config.text_config),
        ("vision", cls[1], model.config.vision_config),
    ):
        alone = getattr(transformers, name)(config)
        weights = {k: v.float() for k, v in getattr(model, f"{tower}_model").state_dict().items()}
        alone.load_state_dict(weights)  # transformers 5: the tower's modules at the top (saved without prefix)
        alone.save_pretrained(tmp_path / name)
        a = specbound.analyze(tmp_path / name, threads=1)
        assert a.model["tower"] == tower
        pd.testing.assert_frame_equal(
            a.matrices.drop(columns="tensors"), both[tower].matrices.drop(columns="tensors"), check_exact=True
        )
        # transformers 4 saved the same tower under its prefix (text_model.*, vision_model.*)
        prefixed = tmp_path / f"{name}-prefixed"
        prefixed.mkdir()
        (prefixed / "config.json").write_text((tmp_path / name / "config.json").read_text())
        stored = load_file(str(tmp_path / name / "model.safetensors"))
        save_file({f"{tower}_model.{k}": v for k, v in stored.items()}, str(prefixed / "model.safetensors"))
        assert specbound.analyze(prefixed, threads=1).all_bounds() == a.all_bounds()
        other = "vision" if tower == "text" else "text"
        with pytest.raises(SpecboundError, match=f"only the {tower} tower"):
            specbound.analyze(tmp_path / name, threads=1, tower=other)


def test_sub_config_defaults_are_the_library_s(saved, tmp_path):
    """A tower's sub-config may leave out what its config class defaults; the spec's defaults are those
    of transformers' CLIPTextConfig, CLIPVisionConfig, SiglipTextConfig and SiglipVisionConfig."""

    family, folder, _ = saved
    spec = builtin_specs()[family]
    classes = {"clip": ("CLIPTextConfig", "CLIPVisionConfig"), "siglip": ("SiglipTextConfig", "SiglipVisionConfig")}
    for tower, cls in zip(("text", "vision"), classes[family]):
        library = getattr(transformers, cls)()
        for key, value in spec.tower_spec(tower).spec.config_defaults.items():
            assert getattr(library, key) == value, (family, tower, key)

    shutil.copy(folder / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    default_act = spec.tower_spec("text").spec.config_defaults["hidden_act"]
    assert config["text_config"]["hidden_act"] == default_act
    del config["text_config"]["hidden_act"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert specbound.analyze(tmp_path, threads=1, tower="text").model["activation"] == default_act


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda folder, tiny: specbound.analyze(tiny, tower="vision"), "one chain"),
        (lambda folder, tiny: specbound.analyze(folder, tower="audio"), "unknown tower 'audio'"),
    ],
)
def test_tower_errors_are_one_line(saved, tiny_bert_dir, call, needle):
    with pytest.raises(SpecboundError, match=needle) as info:
        call(saved[1], tiny_bert_dir)
    assert "\n" not in str(info.value)


def test_opening_one_chain_of_a_two_tower_model_needs_the_tower(saved):
    with pytest.raises(SpecboundError, match="pass tower='text' or tower='vision'"):
        open_model(saved[1])
    model = open_model(saved[1], tower="text")
    assert model.tower == "text" and model.dims.N == TEXT["hidden_size"]
    model.opened_checkpoint.close()


def test_a_sweep_analyses_the_tower_it_is_given(saved, tmp_path, capsys):
    """A sweep stores one record per tower asked for (``--tower``); without it the two-tower checkpoint
    is a failed source whose line says to pass one, and the sweep goes on."""

    store = tmp_path / "store"
    capsys.readouterr()
    assert main(["sweep", str(saved[1]), "--store", str(store), "--no-progress", "--jobs", "1"]) == 1
    assert "pass tower='text' or tower='vision'" in capsys.readouterr().out
    for _ in range(2):  # the second run finds the record stored (config.json and weights unchanged)
        assert (
            main(["sweep", str(saved[1]), "--tower", "vision", "--store", str(store), "--no-progress", "--jobs", "1"])
            == 0
        )
    out = capsys.readouterr().out
    assert "1 analysed" in out and "1 already in the store" in out


def test_a_tower_measured_from_its_initial_weights(saved):
    """``init`` opens the initial weights through the same two-tower spec, as the same tower."""
    a = specbound.analyze(saved[1], threads=1, tower="text", init=saved[1])
    assert a.model["tower"] == "text" and (a.matrices["delta_spectral_norm"] == 0).all()
