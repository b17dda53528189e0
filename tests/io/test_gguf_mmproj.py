"""llama.cpp's multimodal projector files (mmproj-*.gguf) read as a vision tower: each written from a tiny
transformers vision encoder the way its converter does (tests/support/gguf_convert.write_mmproj), and every
number of its analysis equal to the same encoder's Hugging Face folder analysed as the clip / siglip vision
tower; the projector named among the assumptions; the unsupported projector types and hostile metadata
refused in one line."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from support import gguf_bytes
from support.fuzz import clean_outcome
from support.gguf_bytes import BOOL, MMPROJ, STR, gguf_file, mmproj_tensors
from support.gguf_convert import write_mmproj  # noqa: E402
from support.one_line import run_cli
from support.same_numbers import assert_close_tree, numbers  # noqa: E402

import specbound  # noqa: E402
from specbound.errors import SpecboundError  # noqa: E402

VISION = dict(
    hidden_size=24, num_hidden_layers=3, num_attention_heads=2, intermediate_size=40, image_size=8, patch_size=4
)
TEXT_WIDTH = 16
# kind -> (the encoder's transformers classes, its config's extra keys, the projector's tensors as the converter
# names them, with their shapes)
KINDS = {
    "llava": (
        "CLIPVisionModel",
        "CLIPVisionConfig",
        {},  # LLaVA 1.5: a two-layer MLP (LLaVA-NeXT: and a newline)
        {
            "mm.0.weight": (TEXT_WIDTH, 24),
            "mm.0.bias": (TEXT_WIDTH,),
            "mm.2.weight": (TEXT_WIDTH, TEXT_WIDTH),
            "mm.2.bias": (TEXT_WIDTH,),
            "model.image_newline": (TEXT_WIDTH,),
        },
    ),
    "gemma3": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        {"vision_use_head": False},
        {"mm.input_projection.weight": (24, TEXT_WIDTH), "mm.soft_emb_norm.weight": (24,)},
    ),
    "idefics3": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        {"vision_use_head": False},
        {"mm.model.fc.weight": (TEXT_WIDTH, 24 * 4)},
    ),
}


def _folder_model(model, layers: int):
    """The encoder's first ``layers`` blocks as a model of their own (LLaVA's llama.cpp tower: the converter
    drops the last block, whose output LLaVA never reads)."""
    if layers == model.config.num_hidden_layers:
        return model
    config = type(model.config)(**{**model.config.to_dict(), "num_hidden_layers": layers})
    short = type(model)(config).eval()
    missing = short.load_state_dict(model.state_dict(), strict=False)
    assert not missing.missing_keys
    return short


@pytest.fixture(scope="module", params=sorted(KINDS))
def pair(request, tmp_path_factory):
    kind = request.param
    model_cls, config_cls, extra, projector = KINDS[kind]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**VISION, **extra)).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    folder = tmp_path_factory.mktemp(kind)
    rng = np.random.default_rng(1)
    mmproj = write_mmproj(
        folder / f"mmproj-{kind}.gguf",
        model,
        kind,
        {name: rng.normal(size=shape) for name, shape in projector.items()},
        text_width=TEXT_WIDTH,
    )
    hf = folder / "hf"
    _folder_model(model, VISION["num_hidden_layers"] - (kind == "llava")).save_pretrained(hf)
    return kind, hf, mmproj, model


def _without(doc: dict, prefix: str) -> dict:
    doc["assumptions"] = [a for a in doc["assumptions"] if not a["name"].startswith(prefix)]
    return doc


def _oracle_rows(model, layers: int) -> list:
    """``[(layer, role, matrix)]`` from the encoder's own weights in float64, in the analysis' order: each head's
    ``W_Q,h^T W_K,h`` and ``W_V,h^T W_O,h^T``, then ``fc1`` and ``fc2`` (the first ``layers`` blocks)."""
    n, heads = VISION["hidden_size"], VISION["num_attention_heads"]
    d = n // heads
    rows = []
    encoder = getattr(model, "vision_model", model).encoder  # transformers 5: the encoder at the top
    for layer, block in enumerate(encoder.layers[:layers]):
        w = {r: getattr(block.self_attn, f"{r}_proj").weight.detach().double().numpy() for r in "qkv"}
        o = block.self_attn.out_proj.weight.detach().double().numpy()
        rows += [(layer, "QK", w["q"][h * d : (h + 1) * d].T @ w["k"][h * d : (h + 1) * d]) for h in range(heads)]
        rows += [(layer, "OV", w["v"][h * d : (h + 1) * d].T @ o[:, h * d : (h + 1) * d].T) for h in range(heads)]
        rows += [
            (layer, role, getattr(block.mlp, fc).weight.detach().double().numpy())
            for role, fc in (("FF_in", "fc1"), ("FF_out", "fc2"))
        ]
    return rows


def test_mmproj_rows_are_the_encoders_matrices(pair):
    """Every row against the encoder's own weights (not only against specbound's other reader)."""
    kind, _, mmproj, model = pair
    matrices = specbound.analyze(mmproj, threads=1).matrices
    reference = _oracle_rows(model, VISION["num_hidden_layers"] - (kind == "llava"))
    assert list(zip(matrices["layer"], matrices["role"])) == [(layer, role) for layer, role, _ in reference]
    for (_, role, w), (_, row) in zip(reference, matrices.iterrows()):
        assert row["spectral_norm"] == pytest.approx(np.linalg.norm(w, 2), rel=1e-9), role
        assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-9), role
        assert row["norm_1_1"] == pytest.approx(np.abs(w).sum(), rel=1e-9), role


def test_mmproj_equals_the_hf_vision_tower(pair):
    kind, hf, mmproj, _ = pair
    theirs, ours = specbound.analyze(hf, threads=1), specbound.analyze(mmproj, threads=1)
    assert ours.model["family"] == "mmproj_gguf" and ours.model["tower"] == "vision" == theirs.model["tower"]
    assert len(ours.matrices) == len(theirs.matrices) > 0
    assert_close_tree(numbers(theirs, family=False), _without(numbers(ours, family=False), "gguf_mmproj_"), rel=1e-9)


def test_an_f16_mmproj_equals_the_hf_tower_of_its_float16_values(tmp_path):
    """``mmproj-*-f16.gguf`` (the converter's ``--outtype f16``): its matrices are read as stored, exactly, so the
    analysis equals the Hugging Face tower whose weights are the same float16 values."""
    torch.manual_seed(0)
    model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**VISION, vision_use_head=False)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p).mul(0.2).half().float())  # float16 values, held in float32
    mmproj = write_mmproj(tmp_path / "mmproj-model-f16.gguf", model, "gemma3", {}, matrices=np.float16)
    model.save_pretrained(tmp_path / "hf")
    ours = specbound.analyze(mmproj, threads=1)
    assert specbound.io.open_checkpoint(mmproj).dtype("v.blk.0.attn_q.weight") == "F16"
    theirs = specbound.analyze(tmp_path / "hf", threads=1)
    assert_close_tree(numbers(theirs, family=False), _without(numbers(ours, family=False), "gguf_mmproj_"), rel=1e-9)


def test_the_projector_is_named_among_the_assumptions(pair):
    kind, _, mmproj, _ = pair
    doc = json.loads(specbound.analyze(mmproj, threads=1).to_json())
    named = {a["name"]: a for a in doc["assumptions"]}
    sentence = json.dumps(named["gguf_mmproj_projector"])
    assert f"type {'mlp' if kind == 'llava' else kind}" in sentence and "outside the chain" in sentence
    for name in KINDS[kind][3]:
        assert name in sentence
    assert ("gguf_mmproj_ffn_names" in named) == (kind == "llava")  # only the legacy converter swapped the names


# --- what is refused, in one line: projector types without a family, metadata that cannot be the encoder's ---


def _mmproj(tmp_path, metadata=None, tensors=None):
    path = tmp_path / "mmproj-model.gguf"
    metadata, tensors = MMPROJ if metadata is None else metadata, mmproj_tensors() if tensors is None else tensors
    path.write_bytes(gguf_file(metadata, tensors))
    return path


def _with(key, kind, value):
    return [(k, t, v) for k, t, v in MMPROJ if k != key] + ([(key, kind, value)] if kind is not None else [])


def _refusal(path, **options):
    outcome = clean_outcome(specbound.analyze, path, threads=1, **options)
    assert isinstance(outcome, SpecboundError), outcome
    return str(outcome)


def test_the_tiny_file_analyses_as_a_vision_tower(tmp_path):
    result = specbound.analyze(_mmproj(tmp_path), threads=1)
    assert (result.model["tower"], result.model["L"], result.model["N"], result.model["H"]) == ("vision", 1, 8, 2)
    assert list(result.matrices["role"]) == ["QK", "QK", "OV", "OV", "FF_in", "FF_out"]
    assert specbound.analyze(_mmproj(tmp_path), threads=1, tower="vision").bounds == result.bounds


@pytest.mark.parametrize(
    "projector, needles",
    [
        ("pixtral", ["'pixtral'", "Pixtral's vision encoder", "2D rotary", "no family"]),
        ("qwen2.5vl_merger", ["'qwen2.5vl_merger'", "Qwen2.5-VL's vision transformer", "window attention"]),
        ("qwen2vl_merger", ["'qwen2vl_merger'", "Qwen2-VL's vision transformer", "patch merger"]),
        ("qwen3vl_merger", ["'qwen3vl_merger'", "Qwen3-VL", "deepstack"]),
        ("llama4", ["'llama4'", "Llama 4's vision encoder", "pixel-shuffle"]),
        ("ultravox", ["'ultravox'", "an audio encoder"]),
        ("no-such-projector", ["'no-such-projector'", "a vision encoder specbound does not know"]),
    ],
)
def test_an_unsupported_projector_type_is_one_line_naming_it(tmp_path, projector, needles):
    message = _refusal(_mmproj(tmp_path, _with("clip.projector_type", STR, projector)))
    for needle in [*needles, "supported projector types: mlp (LLaVA 1.5: CLIP), gemma3 (Gemma 3: SigLIP)"]:
        assert needle in message, message


def test_the_mixed_modality_key_names_the_vision_projector(tmp_path):
    metadata = _with("clip.projector_type", STR, "qwen2.5o") + [
        ("clip.vision.projector_type", STR, "gemma3"),
        ("clip.has_audio_encoder", BOOL, True),
    ]
    assert specbound.analyze(_mmproj(tmp_path, metadata), threads=1).model["L"] == 1


@pytest.mark.parametrize(
    "key, kind, value, needles",
    [
        (
            "clip.vision.block_count",
            None,
            None,
            ["'clip.vision.block_count' must hold a positive integer", "no such key"],
        ),
        ("clip.vision.embedding_length", None, None, ["'clip.vision.embedding_length'", "no such key"]),
        ("clip.vision.feed_forward_length", None, None, ["'clip.vision.feed_forward_length'", "no such key"]),
        ("clip.vision.attention.head_count", None, None, ["'clip.vision.attention.head_count'", "no such key"]),
        ("clip.projector_type", None, None, ["'clip.projector_type' must name the projector type", "no such key"]),
        ("clip.vision.block_count", "U64", 2**63, ["'clip.vision.block_count'", "at most 2^53"]),
        ("clip.vision.block_count", "U32", 4_000_000_000, ["declares 4,000,000,000 blocks", "tensors of 1"]),
        ("clip.vision.block_count", "U32", 0, ["'clip.vision.block_count' must hold a positive integer", "0"]),
        ("clip.vision.attention.head_count", "U32", 3, ["embedding_length 8 is not a multiple", "head_count 3"]),
        ("clip.vision.embedding_length", "STR", "8", ["'clip.vision.embedding_length'", "'8' (str)"]),
        ("clip.vision.attention.layer_norm_epsilon", "F32", float("nan"), ["layer_norm_epsilon", "finite positive"]),
        ("clip.use_silu", "BOOL", True, ["both clip.use_gelu and clip.use_silu"]),
        ("clip.use_gelu", "U32", 1, ["'clip.use_gelu' must hold a boolean"]),
        ("clip.has_vision_encoder", "BOOL", False, ["clip.has_vision_encoder", "specbound analyses vision encoders"]),
    ],
)
def test_hostile_metadata_is_one_line_naming_the_key(tmp_path, key, kind, value, needles):
    message = _refusal(_mmproj(tmp_path, _with(key, getattr(gguf_bytes, kind) if kind else None, value)))
    for needle in needles:
        assert needle in message, message


def test_the_text_tower_of_an_mmproj_file_is_refused_in_one_line(tmp_path):
    message = _refusal(_mmproj(tmp_path), tower="text")
    assert "holds only the vision tower of a mmproj_gguf model, not the text tower" in message


def test_a_gated_encoder_under_a_supported_type_is_refused_by_its_stray_tensor(tmp_path):
    tensors = {**mmproj_tensors(), "v.blk.0.ffn_gate.weight": np.zeros((12, 8), np.float32)}
    assert "v.blk.0.ffn_gate.weight" in _refusal(_mmproj(tmp_path, tensors=tensors))


# --- a text GGUF and its mmproj file side by side: the text and vision towers of one model ---


def _pair_folder(tmp_path, *extra):
    folder = tmp_path / "model-GGUF"
    folder.mkdir()
    (folder / "model-Q8_0.gguf").write_bytes(gguf_file())  # a one-block llama
    (folder / "mmproj-model-f16.gguf").write_bytes(gguf_file(MMPROJ, mmproj_tensors()))
    (folder / "README.md").write_text("a GGUF repository")
    for name in extra:
        (folder / name).write_bytes((folder / "model-Q8_0.gguf").read_bytes())
    return folder


def _doc(result) -> dict:
    doc = numbers(result)
    doc["model"].pop("tower", None)
    doc["assumptions"] = [a for a in doc["assumptions"] if a["name"] not in ("two_tower", "gguf_mmproj_pair")]
    return doc


def test_a_folder_of_a_text_gguf_and_its_mmproj_is_two_towers(tmp_path):
    folder = _pair_folder(tmp_path)
    both = specbound.analyze(folder, threads=1)
    assert isinstance(both, specbound.TowerAnalyses) and list(both) == ["text", "vision"]
    assert (both["text"].model["tower"], both["vision"].model["tower"]) == ("text", "vision")
    alone = {
        "text": specbound.analyze(folder / "model-Q8_0.gguf", threads=1),
        "vision": specbound.analyze(folder / "mmproj-model-f16.gguf", threads=1),
    }
    assert alone["text"].model["family"] == both["text"].model["family"] == "llama_gguf"
    pair_entry = {a["name"]: a for a in json.loads(both["text"].to_json())["assumptions"]}["gguf_mmproj_pair"]
    assert "mmproj-model-f16.gguf beside it is its vision tower" in pair_entry["effect"]
    for tower in ("text", "vision"):
        assert_close_tree(_doc(alone[tower]), _doc(both[tower]), rel=0)
        picked = specbound.analyze(folder, threads=1, tower=tower)
        assert picked.model["tower"] == tower and picked.bounds == both[tower].bounds


def test_the_cli_reports_both_towers_of_the_pair(tmp_path, capsys):
    rc, out, err = run_cli(capsys, str(_pair_folder(tmp_path)), "--format", "json", "--threads", "1")
    assert rc == 0, err
    doc = json.loads(out)
    assert sorted(doc["towers"]) == ["text", "vision"]
    assert doc["towers"]["vision"]["model"]["family"] == "mmproj_gguf"


def test_a_folder_of_several_text_models_beside_an_mmproj_is_one_line(tmp_path):
    message = _refusal(_pair_folder(tmp_path, "model-Q4_K_M.gguf"))
    assert "text: model-Q4_K_M.gguf, model-Q8_0.gguf; vision: mmproj-model-f16.gguf" in message
    assert "name one file" in message
