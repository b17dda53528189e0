"""docs/schema.md is the JSON document as the code writes it: every key of every object the code
emits is documented there, every key documented as *always* present is emitted, and each key that
comes with ``--init``, ``--n/--margin`` or a rotary family is emitted when that applies."""

import json
import re
import warnings
from pathlib import Path

import pytest
from support.families import save_family
from support.vision_language import build_wrapper

import specbound
from specbound.records.schema import SCHEMA_VERSION

DOC = Path(__file__).resolve().parents[1] / "docs" / "schema.md"
SECTIONS = {  # heading of docs/schema.md -> the objects of a document that section describes
    "Top level": lambda d: [d],
    "`model`": lambda d: [d["model"]],
    "`model.rotary` (rotary)": lambda d: [d["model"]["rotary"]] if d["model"]["rotary"] else [],
    "`model.adapter` (adapter)": lambda d: [d["model"]["adapter"]] if "adapter" in d["model"] else [],
    "`options`": lambda d: [d["options"]],
    "`assumptions[]`": lambda d: d["assumptions"],
    "`layers[]`": lambda d: d["layers"],
    "`matrices[]`": lambda d: d["matrices"],
    "`gap_bound` (gap)": lambda d: [d["gap_bound"]] if "gap_bound" in d else [],
    "`gap_bound.bounds.<bound>` (gap)": lambda d: list(d["gap_bound"]["bounds"].values()) if "gap_bound" in d else [],
}
ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+) \|")


def documented() -> dict[str, dict[str, str]]:
    """``{section: {key: when present}}`` from the tables of docs/schema.md."""
    out, section = {}, None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            out[section] = {}
        elif section is not None and (m := ROW.match(line)):
            out[section][m.group(1)] = m.group(2).strip()
    return out


def emitted_keys(section: str, obj: dict) -> set[str]:
    keys = set(obj)
    if section == "`layers[]`":  # with init, each per-layer term again on W - W0 as delta_<term>
        keys = {k[len("delta_") :] if k.startswith("delta_") else k for k in keys}
    return keys


@pytest.fixture(scope="module")
def documents(tiny_bert_dir, tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    root = tmp_path_factory.mktemp("families")
    for name in ("llama", "gemma3_text", "bloom", "qwen3_moe", "deepseek_v3", "qwen2_vl_text", "qwen2_5_vl_vision"):
        save_family(name, root / name)

    def document(folder, **options):
        return json.loads(specbound.analyze(folder, threads=1, **options).to_json())

    import torch
    import transformers as t

    torch.manual_seed(0)
    t.T5ForConditionalGeneration(
        t.T5Config(d_model=32, d_kv=8, num_layers=1, num_decoder_layers=2, num_heads=4, d_ff=48, vocab_size=50)
    ).save_pretrained(root / "t5")
    t.DebertaV2Model(
        t.DebertaV2Config(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=48,
            vocab_size=50,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            norm_rel_ebd="layer_norm",
            share_att_key=True,
        )
    ).save_pretrained(root / "deberta")
    t.CLIPModel(
        t.CLIPConfig(
            text_config=dict(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=48,
                vocab_size=50,
                max_position_embeddings=16,
            ),
            vision_config=dict(
                hidden_size=24,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=40,
                image_size=8,
                patch_size=4,
            ),
            projection_dim=16,
        )
    ).save_pretrained(root / "clip")
    clip = json.loads(specbound.analyze(root / "clip", threads=1).to_json())

    build_wrapper("gemma3").save_pretrained(root / "gemma3")
    gemma3 = json.loads(specbound.analyze(root / "gemma3", threads=1).to_json())
    adapted = {}
    try:
        import peft
    except ImportError:
        pass
    else:  # a LoRA adapter on the tiny BERT (PEFT starts lora_B at 0: set it, so W - W0 is not 0)
        with warnings.catch_warnings():  # transformers' deprecation note, raised inside PEFT
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = peft.get_peft_model(
                t.BertModel.from_pretrained(tiny_bert_dir),
                peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"]),
            )
        with torch.no_grad():
            for name, p in wrapped.named_parameters():
                if "lora_B" in name:
                    p.normal_()
        wrapped.save_pretrained(root / "adapter")
        adapted[("adapter", "init")] = document(root / "adapter", base=tiny_bert_dir)
    assert set(clip) == {"schema_version", "source", "towers"} and set(clip["towers"]) == {"text", "vision"}
    return {
        (): document(tiny_bert_dir),
        ("stacks",): document(root / "t5"),
        ("disentangled",): document(root / "deberta"),
        ("tower",): clip["towers"]["vision"],
        ("tower", "wrapper", "rotary", "qk_norm"): gemma3["towers"]["text"],
        ("tower", "wrapper"): gemma3["towers"]["vision"],
        ("init", "gap", "rotary"): document(root / "llama", init=root / "llama", n=1000, margin=1.0),
        ("rotary", "qk_norm"): document(root / "gemma3_text"),
        ("alibi",): document(root / "bloom"),
        ("rotary", "qk_norm", "moe"): document(root / "qwen3_moe"),
        ("latent", "moe"): document(root / "deepseek_v3"),
        ("rotary", "grid", "by_layer"): document(root / "qwen2_5_vl_vision"),
        ("rotary", "mrope"): document(root / "qwen2_vl_text"),
        **adapted,
    }


def test_the_page_describes_every_section():
    assert set(documented()) == set(SECTIONS)


def test_every_emitted_key_is_documented_and_every_always_key_emitted(documents):
    doc = documented()
    for conditions, document in documents.items():
        for section, objects in SECTIONS.items():
            keys = doc[section]
            for obj in objects(document):
                found = emitted_keys(section, obj)
                assert found <= set(keys), (section, sorted(found - set(keys)))
                always = {k for k, when in keys.items() if when == "always"}
                assert always <= found, (section, sorted(always - found))
                wanted = {
                    k
                    for k, when in keys.items()
                    if when != "always" and set(re.split(r" and ", when)) <= set(conditions)
                }
                assert wanted <= set(obj) | found, (section, conditions, sorted(wanted - found))


def test_conditional_keys_are_absent_when_their_condition_is(documents):
    plain = documents[()]
    assert "from_init" not in plain and "gap_bound" not in plain and plain["model"]["rotary"] is None
    assert not any(k.startswith("delta_") for row in plain["matrices"] for k in row)
    assert "init" not in plain["options"]


def test_the_documented_schema_version_is_the_one_written(documents):
    """The top-level table's ``schema_version`` value (it said 2 after schema 3 was introduced) and the two-tower
    example's are the version the code writes."""

    written = {document["schema_version"] for document in documents.values() if "schema_version" in document}
    assert written == {SCHEMA_VERSION}
    said = documented()["Top level"]["schema_version"]
    row = next(line for line in DOC.read_text().splitlines() if line.startswith("| `schema_version` |"))
    assert said == "always" and re.search(r"\| always \| `(\d+)`", row).group(1) == str(SCHEMA_VERSION)
    assert f'{{"schema_version": {SCHEMA_VERSION}, "source",' in DOC.read_text()
