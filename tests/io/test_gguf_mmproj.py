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

import specbound  # noqa: E402
from specbound.errors import SpecboundError  # noqa: E402
from support.gguf_convert import write_mmproj  # noqa: E402
from support.same_numbers import assert_close_tree, numbers  # noqa: E402

VISION = dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=2, intermediate_size=40, image_size=8,
              patch_size=4)
TEXT_WIDTH = 16
# kind -> (the encoder's transformers classes, its config's extra keys, the projector's tensors as the converter
# names them, with their shapes)
KINDS = {
    "llava": ("CLIPVisionModel", "CLIPVisionConfig", {},  # LLaVA 1.5: a two-layer MLP
              {"mm.0.weight": (TEXT_WIDTH, 24), "mm.0.bias": (TEXT_WIDTH,), "mm.2.weight": (TEXT_WIDTH, TEXT_WIDTH),
               "mm.2.bias": (TEXT_WIDTH,)}),
    "gemma3": ("SiglipVisionModel", "SiglipVisionConfig", {"vision_use_head": False},
               {"mm.input_projection.weight": (24, TEXT_WIDTH), "mm.soft_emb_norm.weight": (24,)}),
    "idefics3": ("SiglipVisionModel", "SiglipVisionConfig", {"vision_use_head": False},
                 {"mm.model.fc.weight": (TEXT_WIDTH, 24 * 4)}),
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
    mmproj = write_mmproj(folder / f"mmproj-{kind}.gguf", model, kind,
                          {name: rng.normal(size=shape) for name, shape in projector.items()}, text_width=TEXT_WIDTH)
    hf = folder / "hf"
    _folder_model(model, VISION["num_hidden_layers"] - (kind == "llava")).save_pretrained(hf)
    return kind, hf, mmproj


def _without(doc: dict, prefix: str) -> dict:
    doc["assumptions"] = [a for a in doc["assumptions"] if not a["name"].startswith(prefix)]
    return doc


def test_mmproj_equals_the_hf_vision_tower(pair):
    kind, hf, mmproj = pair
    theirs, ours = specbound.analyze(hf, threads=1), specbound.analyze(mmproj, threads=1)
    assert ours.model["family"] == "mmproj_gguf" and ours.model["tower"] == "vision" == theirs.model["tower"]
    assert len(ours.matrices) == len(theirs.matrices) > 0
    assert_close_tree(numbers(theirs, family=False), _without(numbers(ours, family=False), "mmproj_"), rel=1e-9)


def test_the_projector_is_named_among_the_assumptions(pair):
    kind, _, mmproj = pair
    doc = json.loads(specbound.analyze(mmproj, threads=1).to_json())
    named = {a["name"]: a for a in doc["assumptions"]}
    sentence = json.dumps(named["mmproj_projector"])
    assert f"type {'mlp' if kind == 'llava' else kind}" in sentence and "outside the chain" in sentence
    for name in KINDS[kind][3]:
        assert name in sentence
    assert ("mmproj_ffn_names" in named) == (kind == "llava")  # only the legacy converter swapped the names
