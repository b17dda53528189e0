"""Vision-language wrappers under attack: a hostile ``text_config`` / ``vision_config`` (any JSON in place of the
section, or of one of the values a tower's family reads), tensor prefixes renamed to anything, and hostile
wrapper spec documents end in an opened model or in one SpecboundError line, never in another exception; a
renamed prefix that still opens reads the same weights (the same numbers)."""

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import FUZZ, JSON, clean_outcome

from specbound.archs.spec import parse_spec
from specbound.errors import SpecboundError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.numpy import load_file, save_file
from support.vision_language import build_wrapper  # noqa: E402

from specbound.pipeline import open_models

NAMES = sorted(("gemma3", "paligemma", "llava", "idefics3", "llama4", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"))
# the keys a tower's family reads from its section (dimensions, norms' eps, rotary, windows), and the type
KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "num_key_value_heads",
    "head_dim",
    "model_type",
    "rms_norm_eps",
    "rope_theta",
    "rope_parameters",
    "sliding_window",
    "hidden_act",
    "layer_types",
    "layer_norm_eps",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_layers",
    "use_qk_norm",
)
HOSTILE = st.one_of(
    JSON,
    st.sampled_from(
        [
            float("inf"),
            float("nan"),
            True,
            0,
            -1,
            2**63,
            10**30,
            1e300,
            "",
            "x",
            [],
            {},
            None,
            "siglip",
            "gemma3",
            "llama",
            "clip_vision_model",
        ]
    ),
)


@pytest.fixture(scope="module")
def wrappers(tmp_path_factory):
    """``{name: (folder, config)}``: each wrapper saved once."""
    out = {}
    for name in NAMES:
        folder = tmp_path_factory.mktemp(name)
        build_wrapper(name).save_pretrained(folder)
        out[name] = folder, json.loads((folder / "config.json").read_text())
    return out


def _open(folder, tower):
    models = open_models(folder, tower=tower)
    models[0].opened_checkpoint.close()
    return models


@FUZZ
@given(
    name=st.sampled_from(NAMES),
    section=st.sampled_from(["text_config", "vision_config"]),
    key=st.one_of(st.none(), st.sampled_from(KEYS)),
    value=HOSTILE,
)
def test_a_hostile_tower_section_opens_or_is_one_line(wrappers, tmp_path_factory, name, section, key, value):
    folder, config = wrappers[name]
    target = tmp_path_factory.mktemp("c")
    for path in folder.iterdir():
        (target / path.name).symlink_to(path)
    config = json.loads(json.dumps(config))
    if key is None:
        config[section] = value  # the whole section
    else:
        config[section][key] = value
    (target / "config.json").unlink()
    (target / "config.json").write_text(json.dumps(config))
    tower = "text" if section == "text_config" else "vision"
    outcome = clean_outcome(_open, target, tower)
    assert isinstance(outcome, (list, SpecboundError)), outcome


PREFIX = st.text(alphabet="abcdefgilmnorstuvx._", max_size=24)


@FUZZ
@given(name=st.sampled_from(NAMES), prefix=PREFIX, tower=st.sampled_from(["text", "vision"]))
def test_a_renamed_prefix_reads_the_same_weights_or_is_one_line(wrappers, tmp_path_factory, name, prefix, tower):
    """Every tensor of one tower (its names up to ``layers.``) moved under ``prefix``."""

    folder, _ = wrappers[name]
    target = tmp_path_factory.mktemp("p")
    shutil.copy(folder / "config.json", target / "config.json")
    tensors = load_file(str(folder / "model.safetensors"))
    marks = ("language_model.", "text_model.") if tower == "text" else ("vision_tower.", "vision_model.")
    moved = {}
    for key, value in tensors.items():
        at = key.find("layers.")
        mine = any(key.startswith(m) or key.startswith("model." + m) for m in marks)
        moved[prefix + key[at:] if mine and at >= 0 else key] = value
    if len(moved) < len(tensors):
        return  # two tensors under one name: not a checkpoint
    save_file(moved, str(target / "model.safetensors"))
    outcome = clean_outcome(_open, target, tower)
    if isinstance(outcome, list):
        (model,) = outcome
        reference = _open(folder, tower)[0]
        assert (model.spec.family, model.dims) == (reference.spec.family, reference.dims)
        assert all(
            model.ckpt.shape(n) == reference.ckpt.shape(m)
            for n, m in zip(
                sorted(k for k in moved if k.startswith(model.prefix)),
                sorted(k for k in tensors if k.startswith(reference.prefix)),
            )
        )
    else:
        assert isinstance(outcome, SpecboundError)


TOWER_DOC = st.fixed_dictionaries(
    {
        "family": st.one_of(
            st.sampled_from(["gemma3_text", "siglip.vision", "llama", "siglip", "bert.text", "a.b.c", ""]), JSON
        ),
        "config_section": st.one_of(st.just(["text_config"]), JSON),
        "prefixes": st.one_of(st.just(["m."]), JSON),
    },
    optional={
        "model_types": JSON,
        "defaults": JSON,
        "tensors": JSON,
        "ignore": st.one_of(st.sampled_from([5, None, "x"]), JSON),
    },
)


@FUZZ
@given(
    towers=st.dictionaries(st.sampled_from(["text", "vision", "audio", ""]), TOWER_DOC, max_size=3),
    projector=st.one_of(st.none(), JSON, st.fixed_dictionaries({"prefixes": JSON, "description": JSON})),
    ignore=st.one_of(st.just([]), st.sampled_from([3, None, "x", [1], {"a": 1}]), JSON),
)
def test_a_hostile_wrapper_spec_parses_or_is_one_line(towers, projector, ignore):
    doc = {"family": "w", "model_types": ["w"], "towers": towers, "ignore": ignore}
    if projector is not None:
        doc["projector"] = projector
    outcome = clean_outcome(parse_spec, doc, "w.json")
    if isinstance(outcome, SpecboundError):
        assert "w.json" in str(outcome)
    else:
        assert [t.name for t in outcome.towers] == list(towers)
