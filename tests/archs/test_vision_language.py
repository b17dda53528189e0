"""Vision-language wrappers (docs/architectures.md, towers that name a family): each tiny wrapper built by
transformers 5 and saved analyses as two towers; the text tower's numbers, every row and every bound, are those
of the same weights saved alone as its family's causal LM (Gemma 3's QK-norm and local/global layers, Llama 4's
experts); a SigLIP/CLIP vision tower's those of the same weights saved as a standalone vision model; the names
transformers 5 holds in memory read as the saved (hub) ones; the projector is named among the assumptions; a
tower whose family is not shipped or whose config is hostile is one line."""

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from importlib import resources

from support.same_numbers import assert_close_tree, numbers  # noqa: E402
from support.vision_language import (
    WRAPPER_OF,
    WRAPPERS,
    build_wrapper,
    save_causal_lm,  # noqa: E402
    save_text_alone,
    save_vision_alone,
)

import specbound  # noqa: E402
from specbound.archs.registry import (
    builtin_specs,  # noqa: E402
    referenced_family,
)
from specbound.archs.spec import parse_spec
from specbound.archs.towers import tower_config
from specbound.cli import main
from specbound.errors import SpecboundError  # noqa: E402

# wrappers whose modules hold the names transformers 5 saves
HELD_AS_SAVED = ("idefics3", "llama4", "smolvlm", "qwen3_vl")
TOWER_ENTRIES = ("vision_language_tower", "two_tower")  # what says which model a tower is part of


@pytest.fixture(scope="module", params=sorted(WRAPPERS))
def saved(request, tmp_path_factory):
    """``(name, model, folder)``: the wrapper saved with save_pretrained."""
    name = request.param
    model = build_wrapper(name)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    return name, model, folder


def tower_numbers(result) -> dict:
    """An analysis' numbers without what says which model the chain is part of (its tower and wrapper keys and
    the assumption naming the wrapper or the two-tower model)."""
    doc = numbers(result)
    doc["model"].pop("tower", None)
    doc["model"].pop("wrapper", None)
    router = doc["model"].get("experts", {}).pop("router", None)  # a tensor name, prefixed like the rows' tensors
    assert router is None or router.endswith("layers.1.feed_forward.router.weight")
    doc["assumptions"] = [a for a in doc["assumptions"] if a["name"] not in TOWER_ENTRIES]
    return doc


@pytest.mark.parametrize(
    "tower_name, index, save_alone", [("text", 0, save_text_alone), ("vision", 1, save_vision_alone)]
)
def test_each_tower_is_its_family_exactly(saved, tmp_path, tower_name, index, save_alone):
    """Every row and bound of a tower equals the same weights saved alone as its family."""
    name, model, folder = saved
    family = WRAPPERS[name][3][index]
    save_alone(model, name, tmp_path)
    tower = specbound.analyze(folder, tower=tower_name, threads=1)
    alone = specbound.analyze(tmp_path, threads=1)
    assert tower.model["family"] == alone.model["family"] == family and tower.model["tower"] == tower_name
    assert len(tower.matrices) == len(alone.matrices) > 0
    assert_close_tree(tower_numbers(tower), tower_numbers(alone), rel=1e-12)


def test_both_towers_are_reported_with_the_projector_named(saved):
    name, _, folder = saved
    both = specbound.analyze(folder, threads=1)
    assert isinstance(both, specbound.TowerAnalyses) and list(both) == ["text", "vision"]
    wrapper = builtin_specs()[WRAPPER_OF.get(name, name)]
    for tower in both:
        (entry,) = [a for a in both[tower].assumptions if a["name"] == "vision_language_tower"]
        assert wrapper.projector["description"] in entry["effect"] and "no whole-model number" in entry["effect"]
        assert both[tower].model["tower"] == tower


def test_the_names_transformers_holds_in_memory_read_alike(saved, tmp_path):
    """transformers 5 saves the hub's names (``language_model.model.``, ``vision_tower.``); its modules hold
    ``model.language_model.``, ``model.vision_tower.`` ...: a state dict saved as held reads to the same numbers."""
    from safetensors.torch import save_file

    name, model, folder = saved
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    towers = ["text", "vision"]
    for tower in towers:
        held = specbound.analyze(tmp_path, tower=tower, threads=1)
        hub = specbound.analyze(folder, tower=tower, threads=1)
        renamed = held.matrices["tensors"].iloc[0] != hub.matrices["tensors"].iloc[0]
        assert renamed == (WRAPPER_OF.get(name, name) not in HELD_AS_SAVED), (name, tower)
        assert_close_tree(numbers(held), numbers(hub), rel=1e-12)


def _wrapper_folder(tmp_path, name="gemma3"):
    model = build_wrapper(name)
    model.save_pretrained(tmp_path)
    return tmp_path, json.loads((tmp_path / "config.json").read_text())


def _one_line(call, *needles):
    with pytest.raises(SpecboundError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_a_tower_whose_family_is_not_shipped_is_one_line_and_the_other_tower_analyses(tmp_path):
    folder, _ = _wrapper_folder(tmp_path)
    spec = json.loads((specbound_data() / "gemma3.json").read_text())
    spec["towers"]["vision"]["family"] = "nonesuch_vision"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    _one_line(
        lambda: specbound.analyze(folder, arch_spec=tmp_path / "spec.json", threads=1),
        "'nonesuch_vision'",
        "vision tower",
        "--tower",
    )
    text = specbound.analyze(folder, arch_spec=tmp_path / "spec.json", tower="text", threads=1)
    assert text.model["family"] == "gemma3_text"


def specbound_data():
    return resources.files("specbound.archs") / "data"


@pytest.mark.parametrize(
    "section, value, needles",
    [
        ("text_config", None, ["text_config", "text tower"]),
        ("text_config", [1, 2], ["text_config", "text tower"]),
        (
            "text_config",
            {"model_type": "gemma3_text", "num_hidden_layers": "two"},
            ["the text tower (text_config of config.json)", "num_hidden_layers", "'two'"],
        ),
        ("text_config", {"model_type": "gemma3_text", "hidden_size": -32}, ["text_config", "hidden_size", "-32"]),
        ("text_config", {"model_type": "gemma3_text", "rms_norm_eps": float("inf")}, ["text_config", "rms_norm_eps"]),
        ("text_config", {"model_type": "gemma3_text", "sliding_window": 1e400}, ["text_config", "sliding_window"]),
        ("text_config", {"model_type": "no_such_lm"}, ["'no_such_lm'", "text tower"]),
        ("text_config", {"model_type": "siglip"}, ["siglip", "text tower"]),
        (
            "vision_config",
            {"model_type": "siglip_vision_model", "num_attention_heads": 10**30},
            ["the vision tower (vision_config of config.json)", "num_heads"],
        ),
    ],
)
def test_a_hostile_tower_config_is_one_line(tmp_path, section, value, needles):
    folder, config = _wrapper_folder(tmp_path)
    tower = "text" if section == "text_config" else "vision"
    if isinstance(value, dict):
        value = {**config[section], **value}
    config[section] = value
    (folder / "config.json").write_text(json.dumps(config))
    _one_line(lambda: specbound.analyze(folder, tower=tower, threads=1), *needles)


@pytest.mark.parametrize(
    "doc, needle",
    [
        (
            {
                "towers": {
                    "text": {"family": "gemma3_text", "config_section": "text_config", "prefixes": ["m."]},
                    "vision": {"config_section": "vision_config", "prefixes": ["v."], "config": {}, "tensors": {}},
                }
            },
            "every tower names a 'family'",
        ),
        (
            {"towers": {"text": {"family": "../gemma", "config_section": "text_config", "prefixes": ["m."]}}},
            "'family' must name a shipped family",
        ),
        (
            {
                "towers": {
                    "text": {
                        "family": "gemma3_text",
                        "config_section": "text_config",
                        "prefixes": ["m."],
                        "tensors": {},
                    }
                }
            },
            "tower 'text' must be an object",
        ),
        (
            {
                "towers": {"text": {"family": "gemma3_text", "config_section": "text_config", "prefixes": ["m."]}},
                "block": "parallel",
            },
            "only the keys",
        ),
        (
            {
                "towers": {"text": {"family": "gemma3_text", "config_section": "text_config", "prefixes": ["m."]}},
                "projector": {"prefixes": "p."},
            },
            "'projector' must be an object",
        ),
        (
            {"projector": {"prefixes": ["p."], "description": "a map"}, "config": {}, "tensors": {}},
            "'projector' belongs",
        ),
        (
            {"towers": {"text": {"family": "llama", "config_section": "text_config", "prefixes": ["m."]}}, "ignore": 3},
            "'ignore' must be a list of strings",
        ),
        (
            {
                "towers": {"text": {"family": "llama", "config_section": "text_config", "prefixes": ["m."]}},
                "ignore": None,
            },
            "'ignore' must be a list of strings",
        ),
        (
            {"towers": {"text": {"family": "llama", "config_section": "text_config", "prefixes": ["m."], "ignore": 5}}},
            "'ignore' must be a list of strings",
        ),
        (
            {
                "towers": {
                    "text": {
                        "config_section": "text_config",
                        "prefixes": ["m."],
                        "config": {},
                        "tensors": {},
                        "ignore": "x",
                    }
                },
                "block": "sequential",
            },
            "'ignore' must be a list of strings",
        ),
    ],
)
def test_a_bad_wrapper_spec_is_one_line(tmp_path, doc, needle):
    doc = {"family": "w", "description": "", "model_types": ["w"], **doc}
    _one_line(lambda: parse_spec(doc, "w.json"), needle, "docs/architectures.md")


def test_the_text_tower_of_a_family_that_is_two_towers_is_refused(tmp_path):
    folder, _ = _wrapper_folder(tmp_path)
    spec = json.loads((specbound_data() / "gemma3.json").read_text())
    spec["towers"]["text"]["family"] = "siglip"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    config = json.loads((folder / "config.json").read_text())
    del config["text_config"]["model_type"]  # the tower's family is then the one the spec names
    (folder / "config.json").write_text(json.dumps(config))
    _one_line(
        lambda: specbound.analyze(folder, arch_spec=tmp_path / "spec.json", tower="text", threads=1),
        "siglip",
        "not one chain",
    )


def test_the_outputs_show_both_towers(tmp_path, capsys):
    """The CLI's headline and summary, the JSON document, the saved folder (one document per tower) and the
    notebook's HTML view of a wrapper carry both towers, as a two-tower model's do."""

    folder, _ = _wrapper_folder(tmp_path / "gemma3")
    assert main(["analyze", str(folder), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "text.spectral_adaptive" in out and "vision.spectral_adaptive" in out
    assert main(["analyze", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "=== tower text ===" in out and "=== tower vision ===" in out
    assert out.count("no whole-model number") == 2  # each tower's summary says what its number is of
    assert main(["analyze", str(folder), "--tower", "vision", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["model"]["tower"], doc["model"]["family"], doc["model"]["wrapper"]) == ("vision", "siglip", "gemma3")
    both = specbound.analyze(folder, threads=1)
    assert "<h4>tower text</h4>" in both._repr_html_() and "<h4>tower vision</h4>" in both._repr_html_()
    both.save(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == ["text", "vision"]
    assert specbound.TowerAnalyses.load(tmp_path / "out").all_bounds() == both.all_bounds()
    assert specbound.Analysis.load(tmp_path / "out" / "text").model["family"] == "gemma3_text"


def _audio_language(folder):
    """Qwen2-Audio built tiny and saved: a Qwen2 text model beside an audio tower no family reads."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    text = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        model_type="qwen2",
    )
    audio = dict(
        d_model=16,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=24,
        num_mel_bins=8,
        max_source_positions=8,
    )
    model = transformers.Qwen2AudioForConditionalGeneration(
        transformers.Qwen2AudioConfig(text_config=text, audio_config=audio)
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(folder)
    return model


def test_an_unsupported_wrapper_is_one_line_and_its_known_text_tower_analyses(tmp_path):
    model = _audio_language(tmp_path / "audio")
    _one_line(
        lambda: specbound.analyze(tmp_path / "audio", threads=1),
        "model_type='qwen2_audio'",
        "audio_config model_type='qwen2_audio_encoder' (audio towers are not analysed)",
        "--tower text",
        "the llama family",
    )
    _one_line(lambda: specbound.analyze(tmp_path / "audio", tower="vision", threads=1), "--tower text")
    text = specbound.analyze(tmp_path / "audio", tower="text", threads=1)
    save_causal_lm(model.model.language_model if hasattr(model, "model") else model.language_model, tmp_path / "alone")
    alone = specbound.analyze(tmp_path / "alone", threads=1)
    assert text.model["family"] == "llama" and text.model["tower"] == "text"
    assert_close_tree(tower_numbers(text), tower_numbers(alone), rel=1e-12)


@pytest.mark.parametrize(
    "change, needles",
    [
        (
            {
                "model_type": "gemma3n",
                "text_config": {"model_type": "gemma3n_text"},
                "audio_config": {"model_type": "gemma3n_audio"},
            },
            [
                "model_type='gemma3n'",
                "text_config model_type='gemma3n_text'",
                "audio towers are not analysed",
                "No section names a family",
            ],
        ),
        (
            {"model_type": "internvl_chat", "auto_map": {"AutoModel": "modeling_internvl_chat.InternVLChatModel"}},
            ["model_type='internvl_chat'", "remote code", "--tower text"],
        ),
    ],
)
def test_a_wrapper_no_family_reads_is_refused_naming_what_is_missing(tmp_path, change, needles):
    folder, config = _wrapper_folder(tmp_path)
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(config.get(key), dict) else value
    (folder / "config.json").write_text(json.dumps(config))
    for tower in (None, "vision"):
        _one_line(lambda: specbound.analyze(folder, tower=tower, threads=1), *needles)


def test_arch_infer_drafts_towers_that_name_the_families_of_the_sections(saved, tmp_path, capsys):
    """``specbound arch infer`` of a wrapper reads its text_config / vision_config: each tower whose model_type a
    shipped family reads references it, under the prefix holding that family's layer-0 query weight; the rest
    is the projector (VERIFY); the draft analyses each tower to the shipped wrapper's numbers."""

    name, _, folder = saved
    text_family, vision_family = WRAPPERS[name][3]
    assert main(["arch", "infer", str(folder), "--out", str(tmp_path / "spec.json")]) == 0
    report = capsys.readouterr().err
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert spec["towers"]["text"]["family"] in (text_family, "llama") and "VERIFY  projector" in report
    assert "self-check on this checkpoint: ok" in report
    towers = ["text", "vision"]
    assert sorted(spec["towers"]) == sorted(towers)
    for tower in towers:
        drafted = specbound.analyze(folder, arch_spec=tmp_path / "spec.json", tower=tower, threads=1)
        shipped_numbers = tower_numbers(specbound.analyze(folder, tower=tower, threads=1))
        assert_close_tree(tower_numbers(drafted), shipped_numbers, rel=0)


def test_arch_infer_of_a_wrapper_whose_text_family_is_unknown_drafts_one_chain(tmp_path, capsys):
    """No shipped family reads the text model (text_config's model_type unknown): the draft is the one-chain
    drafter's, from the tensor names, as for any unknown checkpoint."""

    folder, config = _wrapper_folder(tmp_path / "w", "llava")
    config["model_type"], config["text_config"]["model_type"] = "my_vlm", "my_lm"
    (folder / "config.json").write_text(json.dumps(config))
    main(["arch", "infer", str(folder), "--out", str(tmp_path / "spec.json")])
    report = capsys.readouterr().err
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert "towers" not in spec and "tensors" in spec and "VERIFY  projector" not in report


DEFAULTS = [
    (name, tower)
    for name, spec in sorted(builtin_specs().items())
    for tower in spec.towers or ()
    if tower.family is not None and tower.defaults
]


@pytest.mark.parametrize("name, tower", DEFAULTS, ids=[f"{n}-{t.name}" for n, t in DEFAULTS])
def test_a_towers_defaults_are_its_librarys(name, tower):
    """A wrapper built by transformers from a section holding only its model_type gets exactly the tower's
    ``defaults`` (transformers 5 keeps rope_theta in rope_parameters)."""

    model_type = referenced_family(tower.family, by_model_type=False, what="").model_types[0]
    config = transformers.AutoConfig.for_model(name, **{tower.config_sections[0]: {"model_type": model_type}})
    section = getattr(config, tower.config_sections[0])
    for key, value in tower.defaults.items():
        found = getattr(section, key, None)
        if found is None and key == "rope_theta":
            found = section.rope_parameters["rope_theta"]
        if found is None and key == "sliding_window_pattern":
            found = section._sliding_window_pattern
        assert found == value, (name, key, found, value)


def test_defaults_fill_only_a_section_of_the_named_familys_own_class(tmp_path):
    """LLaVA 1.5's text_config lists little more than its model_type: LlamaConfig's defaults fill it; a Mistral
    section leaving a key out gets none of them (its library's defaults differ): one line, never Llama's."""

    llava = builtin_specs()["llava"].tower_spec("text")
    assert tower_config(llava, {"text_config": {"model_type": "llama"}})["num_attention_heads"] == 32
    assert "num_attention_heads" not in tower_config(llava, {"text_config": {"model_type": "mistral"}})
    folder, config = _wrapper_folder(tmp_path, "llava_mistral")
    del config["text_config"]["num_attention_heads"]
    (folder / "config.json").write_text(json.dumps(config))
    _one_line(lambda: specbound.analyze(folder, tower="text", threads=1), "text_config", "num_attention_heads")


def test_a_tower_measured_from_its_initial_weights(tmp_path):
    """``init`` of a wrapper: the same tower of the initial checkpoint, opened through the same wrapper spec."""
    build_wrapper("gemma3", seed=0).save_pretrained(tmp_path / "trained")
    build_wrapper("gemma3", seed=1).save_pretrained(tmp_path / "init")
    for tower in ("text", "vision"):
        a = specbound.analyze(tmp_path / "trained", tower=tower, init=tmp_path / "init", threads=1)
        assert "from_init" in json.loads(a.to_json()) and a.model["tower"] == tower
        same = specbound.analyze(tmp_path / "trained", tower=tower, init=tmp_path / "trained", threads=1)
        assert all(value == 0 for value in same.matrices["delta_spectral_norm"]), tower


def test_a_wrapper_in_memory_is_the_saved_one(saved):
    """``analyze(model)`` of the module a notebook holds (transformers 5's in-memory names) is the saved folder's
    analysis, tower by tower."""
    name, model, folder = saved
    held, stored = specbound.analyze(model, threads=1), specbound.analyze(folder, threads=1)
    assert list(held) == list(stored) == ["text", "vision"]
    for tower in held:
        assert_close_tree(numbers(held[tower]), numbers(stored[tower]), rel=1e-12)
