"""``specbound arch infer``: a spec drafted from a tiny model of a shipped family, renamed to an
unknown model_type, analyses to exactly the numbers of the shipped spec; what the weights cannot
decide is flagged, and flagging it is not vacuous (a square GPT-2 drafted as ``linear`` really gives
other numbers until the layout is fixed).  Name-level cases use fabricated safetensors files."""

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file
from support.same_numbers import numbers

import specbound
from specbound import SpecboundError
from specbound.archs import builtin_specs, parse_spec
from specbound.archs.infer import infer_spec
from specbound.cli import main
from specbound.io import open_checkpoint


def numbers_without_family(result):
    return numbers(result, family=False)


N, L, H, D_FF = 32, 2, 4, 48


def _build(family):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    T = transformers
    models = {
        "bert": lambda: T.BertForSequenceClassification(
            T.BertConfig(
                hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        "llama": lambda: T.LlamaForCausalLM(
            T.LlamaConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
            )
        ),
        "opt": lambda: T.OPTForCausalLM(
            T.OPTConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                ffn_dim=D_FF,
                word_embed_proj_dim=N,
                vocab_size=50,
                max_position_embeddings=16,
            )
        ),
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(n_embd=N, n_layer=L, n_head=H, n_inner=None, vocab_size=50, n_positions=16)
        ),
        "gpt_neox": lambda: T.GPTNeoXForCausalLM(
            T.GPTNeoXConfig(
                hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        "phi": lambda: T.PhiForCausalLM(
            T.PhiConfig(
                hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        "phi3": lambda: T.Phi3ForCausalLM(
            T.Phi3Config(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
                pad_token_id=0,
            )
        ),
        "gptj": lambda: T.GPTJForCausalLM(
            T.GPTJConfig(n_embd=N, n_layer=L, n_head=H, rotary_dim=4, vocab_size=50, n_positions=16)
        ),
        "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=N, n_layer=L, n_head=H, vocab_size=50)),
        "falcon": lambda: T.FalconForCausalLM(
            T.FalconConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_kv_heads=2,
                new_decoder_architecture=True,
                vocab_size=50,
            )
        ),
        "mixtral": lambda: T.MixtralForCausalLM(
            T.MixtralConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
                num_local_experts=3,
                num_experts_per_tok=2,
            )
        ),
        "qwen2_moe": lambda: T.Qwen2MoeForCausalLM(
            T.Qwen2MoeConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=64,
                moe_intermediate_size=D_FF,
                shared_expert_intermediate_size=40,
                vocab_size=50,
                num_experts=3,
                num_experts_per_tok=2,
            )
        ),
        "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(
            T.Qwen3MoeConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=64,
                moe_intermediate_size=D_FF,
                vocab_size=50,
                num_experts=3,
                num_experts_per_tok=2,
                max_position_embeddings=32,
            )
        ),
        "qwen3": lambda: T.Qwen3ForCausalLM(
            T.Qwen3Config(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=D_FF,
                vocab_size=50,
                max_position_embeddings=32,
            )
        ),
        "olmo2": lambda: T.Olmo2ForCausalLM(
            T.Olmo2Config(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
                max_position_embeddings=32,
            )
        ),
        "gemma3_text": lambda: T.Gemma3ForCausalLM(
            T.Gemma3TextConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=D_FF,
                vocab_size=50,
                max_position_embeddings=32,
            )
        ),
        # disentangled attention: its position terms are in config.json, not in the weights
        "deberta_v2": lambda: T.DebertaV2ForSequenceClassification(
            T.DebertaV2Config(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
                relative_attention=True,
                pos_att_type=["p2c", "c2p"],
                position_buckets=8,
                max_relative_positions=16,
                norm_rel_ebd="layer_norm",
                share_att_key=True,
                position_biased_input=False,
            )
        ),
        # every matrix square (d_ff = N): nothing reveals the layout
        "bert_square": lambda: T.BertModel(
            T.BertConfig(hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=N, vocab_size=50)
        ),
    }
    torch.manual_seed(0)
    model = models[family]()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial everywhere (biases and norms included)
            p.normal_(std=0.2)
    return model


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    """``renamed(family)`` -> (the saved folder, a copy whose model_type is 'my<family>')."""
    pytest.importorskip("torch")
    root, built = tmp_path_factory.mktemp("archinfer"), {}

    def get(family):
        if family not in built:
            original, copy = root / family, root / f"my{family}"
            _build(family).save_pretrained(str(original))
            shutil.copytree(original, copy)
            config = json.loads((copy / "config.json").read_text())
            config["model_type"] = f"my{family}"
            (copy / "config.json").write_text(json.dumps(config))
            built[family] = original, copy
        return built[family]

    return get


def infer_cli(capsys, source, out=None):
    capsys.readouterr()
    rc = main(["arch", "infer", str(source), *(["--out", str(out)] if out else [])])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr
    return stdout, stderr


def _expert_names(spec):
    """``{role: name}`` of a spec's experts, shared expert and router (a parsed spec or a document)."""
    if isinstance(spec, dict):
        experts = spec.get("experts")
        if not experts:
            return {}
        out = {r: t["name"] for r, t in experts["tensors"].items()} | {"router": experts["router"]["name"]}
        shared = experts.get("shared", {})
        return (
            out
            | {f"shared {r}": t["name"] for r, t in shared.get("tensors", {}).items()}
            | ({"shared gate": shared["gate"]["name"]} if "gate" in shared else {})
        )
    if spec.experts is None:
        return {}
    e = spec.experts
    return (
        {r: t.name for r, t in e.tensors.items()}
        | {"router": e.router.name}
        | {f"shared {r}": t.name for r, t in (e.shared or {}).items()}
        | ({"shared gate": e.shared_gate.name} if e.shared_gate else {})
    )


@pytest.mark.parametrize(
    "family",
    [
        "bert",
        "llama",
        "opt",
        "gpt2",
        "gpt_neox",
        "phi",
        "phi3",
        "gptj",
        "bloom",
        "falcon",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "deberta_v2",
    ],
)
def test_draft_analyses_like_the_shipped_spec(family, renamed, tmp_path, capsys):
    original, copy = renamed(family)
    with pytest.raises(SpecboundError, match="specbound arch infer"):
        specbound.analyze(copy, threads=1)
    spec_file = tmp_path / "spec.json"
    stdout, report = infer_cli(capsys, copy, spec_file)
    assert stdout == ""
    drafted = json.loads(spec_file.read_text())
    assert json.loads(infer_cli(capsys, copy)[0]) == drafted  # stdout without --out: the same document
    parse_spec(drafted, "draft")
    assert drafted["model_types"] == [f"my{family}"]
    assert "self-check on this checkpoint: ok" in report
    # the draft finds the shipped spec's tensors, and no ignore pattern can swallow one of them
    reference_spec = builtin_specs()[family]
    assert {r: t["name"] for r, t in drafted["tensors"].items()} == {
        r: t.name for r, t in reference_spec.tensors.items()
    }
    assert _expert_names(drafted) == _expert_names(reference_spec)
    assert drafted.get("rotary", {}).get("pairing") == reference_spec.rotary
    roles = [
        t["name"].replace("${layer}", "0").replace("${expert}", "1")
        for t in [*drafted["tensors"].values(), *drafted.get("experts", {}).get("tensors", {}).values()]
    ]
    assert not [(p, n) for p in drafted["ignore"] for n in roles if re.search(p, n)]
    # every number equals the shipped spec's analysis of the same weights
    ours = numbers_without_family(specbound.analyze(copy, arch_spec=spec_file, threads=1))
    shipped = numbers_without_family(specbound.analyze(original, threads=1))
    if family == "bloom":  # ALiBi and BLOOM's fixed GELU are in its code, not its config: said, same numbers
        assert shipped["model"].pop("alibi") and shipped["model"].pop("activation") == "gelu_pytorch_tanh"
        assert "alibi_positions" in {e["name"] for e in shipped.pop("assumptions") if e["applies"]}
        assert ours["model"].pop("activation") is None and ours.pop("assumptions")
        assert ours["options"].pop("l_phi_source").startswith("default") and shipped["options"].pop("l_phi_source")
    assert ours == shipped
    assert json.loads(spec_file.read_text())["family"] == f"my{family}"


@pytest.mark.parametrize("family, span", [("qwen3", "head"), ("olmo2", "all_heads"), ("gemma3_text", "head")])
def test_query_key_norms_are_drafted_not_ignored(family, span, renamed, tmp_path, capsys):
    """q_norm / k_norm change the logit: the draft names them (span from their size, the gain's w or
    1 + w flagged) and analyses to the shipped family's numbers; no ignore pattern swallows them."""
    original, copy = renamed(family)
    spec_file = tmp_path / "spec.json"
    report = infer_cli(capsys, copy, spec_file)[1]
    drafted = json.loads(spec_file.read_text())
    shipped = builtin_specs()[family].qk_norm
    assert drafted["qk_norm"]["q"] == shipped.q and drafted["qk_norm"]["k"] == shipped.k
    assert drafted["qk_norm"]["span"] == span == shipped.span and drafted["qk_norm"]["gain"] == shipped.gain
    assert "VERIFY  qk_norm gain" in report and "self-check on this checkpoint: ok" in report
    norms = [drafted["qk_norm"][w].replace("${layer}", "0") for w in "qk"]
    assert not [(p, n) for p in drafted["ignore"] for n in norms if re.search(p, n)]
    ours, theirs = (
        numbers_without_family(a)
        for a in (specbound.analyze(copy, arch_spec=spec_file, threads=1), specbound.analyze(original, threads=1))
    )
    # the shipped spec also names what the weights cannot show (norms after each sublayer, ...)
    seen = {e["name"] for e in ours["assumptions"]}
    theirs["assumptions"] = [e for e in theirs["assumptions"] if e["name"] in seen]
    assert "qk_norm" in seen and ours == theirs


@pytest.mark.parametrize(
    "extra, needle",
    [
        (
            {
                "attention.q_norm.weight": (4,),
                "attention.k_norm.weight": (4,),
                "attention.q_norm.bias": (4,),
                "attention.k_norm.bias": (4,),
            },
            "with a bias",
        ),
        ({"attention.q_norm.weight": (4,)}, "one q and one k gain"),
        ({"attention.q_norm.weight": (3,), "attention.k_norm.weight": (3,)}, "normalise something else"),
    ],
    ids=["layernorm", "q-only", "odd-size"],
)
def test_a_query_key_norm_that_cannot_be_drafted_is_refused_naming_it(tmp_path, capsys, extra, needle):
    folder = _fake(tmp_path / "m", _layers("layers.{}", {**META, **extra}), **CONFIG)
    capsys.readouterr()
    assert main(["arch", "infer", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and needle in err and "layers.0.attention.q_norm" in err


def test_report_flags_what_the_weights_cannot_decide(renamed, capsys):
    _, bert = renamed("bert")
    report = infer_cli(capsys, bert)[1]
    # BERT's attention weights are 32 x 32: their layout comes from the non-square feed-forward ones
    assert re.search(r"VERIFY  layout q, k, v, o: linear\n.*A SQUARE MATRIX CANNOT REVEAL ITS ORIENTATION", report)
    assert re.search(r"\n        layout ff_in, ff_out: linear\n.*non-square", report)
    assert "VERIFY  block: sequential" in report
    assert "num_attention_heads = 4" in report and "cannot be seen in the weights" in report
    _, neox = renamed("gpt_neox")
    report = infer_cli(capsys, neox)[1]
    assert "VERIFY  fused qkv: per_head" in report and "cannot be told apart from shapes" in report
    assert "VERIFY  block: parallel when use_parallel_residual is true" in report


def test_a_square_model_is_drafted_linear_and_flagged(renamed, tmp_path, capsys):
    """BERT with d_ff = N: every weight is square, so nothing shows the layout.  The draft assumes
    nn.Linear and flags it; the guess matters (Conv1D's orientation gives other numbers) and, being
    right for BERT, gives the shipped spec's numbers."""
    original, copy = renamed("bert_square")
    spec_file = tmp_path / "spec.json"
    report = infer_cli(capsys, copy, spec_file)[1]
    assert "VERIFY  layout q, k, v, o, ff_in, ff_out: linear" in report
    assert "no weight of the layer is non-square" in report
    reference = numbers_without_family(specbound.analyze(original, threads=1))
    assert numbers_without_family(specbound.analyze(copy, arch_spec=spec_file, threads=1)) == reference
    drafted = json.loads(spec_file.read_text())
    for rule in drafted["tensors"].values():
        rule["layout"] = "conv1d"
    spec_file.write_text(json.dumps(drafted))
    assert numbers_without_family(specbound.analyze(copy, arch_spec=spec_file, threads=1)) != reference


# --- fabricated checkpoints: names only ----------------------------------------------------------------


def _fake(folder, shapes, **config):
    folder.mkdir()
    save_file({k: np.zeros(s, dtype=np.float32) for k, s in shapes.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "mine", **config}))
    return folder


def _layers(template, shapes, layers=2):
    return {f"{template.format(i)}.{rest}": s for i in range(layers) for rest, s in shapes.items()}


META = {
    "attention.wq.weight": (8, 8),
    "attention.wk.weight": (8, 8),
    "attention.wv.weight": (8, 8),
    "attention.wo.weight": (8, 8),
    "feed_forward.w1.weight": (12, 8),
    "feed_forward.w2.weight": (8, 12),
    "feed_forward.w3.weight": (12, 8),
    "attention_norm.weight": (8,),
    "ffn_norm.weight": (8,),
}
CONFIG = dict(dim=8, n_layers=2, n_heads=2, hidden_dim=12, hidden_act="silu")
ATTENTION = {k: v for k, v in META.items() if not k.startswith("feed_forward")}
EXPERTS = {
    f"feed_forward.experts.{e}.{w}.weight": s
    for e in range(2)
    for w, s in (("w1", (12, 8)), ("w2", (8, 12)), ("w3", (12, 8)))
}


def test_meta_llama_names(tmp_path):
    shapes = {
        **_layers("layers.{}", META),
        "tok_embeddings.weight": (10, 8),
        "norm.weight": (8,),
        "output.weight": (10, 8),
    }
    draft = infer_spec(open_checkpoint(_fake(tmp_path / "m", shapes, **CONFIG)))
    tensors = {r: t["name"] for r, t in draft.spec["tensors"].items()}
    assert tensors == {
        "q": "layers.${layer}.attention.wq.weight",
        "k": "layers.${layer}.attention.wk.weight",
        "v": "layers.${layer}.attention.wv.weight",
        "o": "layers.${layer}.attention.wo.weight",
        "ff_gate": "layers.${layer}.feed_forward.w1.weight",
        "ff_up": "layers.${layer}.feed_forward.w3.weight",
        "ff_out": "layers.${layer}.feed_forward.w2.weight",
    }
    assert draft.spec["feed_forward"] == "gated"
    assert draft.spec["config"] == {
        "num_layers": ["n_layers"],
        "hidden_size": ["dim"],
        "num_heads": ["n_heads"],
        "ff_size": ["hidden_dim"],
        "activation": ["hidden_act"],
    }
    assert any(g.topic == "roles w1/w2/w3" and g.verify for g in draft.guesses)
    assert draft.check.startswith("ok")
    assert set(draft.spec["ignore"]) >= {r"^tok_embeddings\.", r"^norm\.", r"^output\."}


def test_unmatched_layer_weight_is_ignored_loudly(tmp_path):
    shapes = _layers("layers.{}", {**META, "attention.rel_bias.weight": (8, 8)})
    draft = infer_spec(open_checkpoint(_fake(tmp_path / "m", shapes, **CONFIG)))
    flagged = [g for g in draft.guesses if g.topic == "ignored attention.rel_bias.weight"]
    assert flagged and flagged[0].verify and "leave it out" in flagged[0].evidence
    assert draft.check.startswith("ok")


def test_missing_config_key_is_named_and_the_self_check_fails(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "hidden_dim"}
    draft = infer_spec(open_checkpoint(_fake(tmp_path / "m", _layers("layers.{}", META), **config)))
    assert any(
        g.topic == "config ff_size" and g.verify and "add intermediate_size = 12" in g.evidence for g in draft.guesses
    )
    assert draft.check.startswith("FAILS: config.json needs a positive integer intermediate_size")


@pytest.mark.parametrize(
    "shapes, needle",
    [
        ({"embed.weight": (10, 8), "head.weight": (3, 8)}, "no repeated layer found"),
        ({**_layers("encoder.block.{}", META), **_layers("decoder.block.{}", META)}, "encoder-decoder"),
        (_layers("layers.{}", {**ATTENTION, **EXPERTS}), "their router cannot be told"),
        (
            _layers(
                "layers.{}",
                {
                    **ATTENTION,
                    **EXPERTS,
                    "feed_forward.gate.weight": (2, 8),
                    "feed_forward.experts.1.w4.weight": (12, 8),
                },
            ),
            "not numbered 0..E-1 with the same tensors",
        ),
        (
            _layers("layers.{}", {**META, **EXPERTS, "feed_forward.gate.weight": (2, 8)}),
            "a layer holds feed-forward weights beside its experts",
        ),
        (
            _layers(
                "layers.{}",
                {
                    **ATTENTION,
                    "feed_forward.gate.weight": (2, 8),
                    "feed_forward.experts.gate_up_proj": (2, 24, 8),
                    "feed_forward.experts.down_proj": (2, 8, 12),
                },
            ),
            "is a 3-D tensor (2, 8, 12): a bank of expert weights",
        ),
        (
            _layers(
                "layers.{}",
                {
                    **ATTENTION,
                    "feed_forward.gate.weight": (2, 8),
                    "feed_forward.experts.0.w2.weight": (8, 12),
                    "feed_forward.experts.1.w2.weight": (8, 12),
                },
            ),
            "an expert's 2-D weights are w2.weight",
        ),
        (_layers("layers.{}", {k: v for k, v in META.items() if "feed_forward" not in k}), "ff_in, ff_out"),
    ],
    ids=[
        "no-layers",
        "two-stacks",
        "no-router",
        "uneven-experts",
        "dense-beside-experts",
        "expert-bank",
        "expert-without-gate",
        "no-feed-forward",
    ],
)
def test_what_cannot_be_drafted_is_a_one_line_error(tmp_path, capsys, shapes, needle):
    folder = _fake(tmp_path / "m", shapes, **CONFIG)
    capsys.readouterr()
    assert main(["arch", "infer", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and needle in err and "write the spec by hand" in err


def test_onnx_source_layouts_are_fixed_by_the_graph(tmp_path):
    pytest.importorskip("onnx")
    from support.onnx_graphs import bert_layer, matmul_graph, plain_matmul

    draft = infer_spec(open_checkpoint(matmul_graph(tmp_path / "m", *bert_layer(plain_matmul)[1:])))
    assert draft.check.startswith("ok")
    onnx_note = [g for g in draft.guesses if "ONNX graph fixes" in g.evidence]
    assert onnx_note and onnx_note[0].verify


def test_cli_usage_errors_are_one_line(renamed, tmp_path, capsys):
    _, copy = renamed("bert")
    for argv, needle in (
        (["arch"], "infer"),
        (["arch", "infer"], "source"),
        (["arch", "infer", str(copy), "--out", str(tmp_path / "missing" / "x.json")], "cannot write"),
    ):
        capsys.readouterr()
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and needle in err, err


# --- two chains: encoder-decoders and two-tower models ------------------------------------------


def _seq2seq(name):
    import transformers as t

    seq = dict(
        vocab_size=60,
        max_position_embeddings=16,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    sizes = dict(
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=40,
    )
    text = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        vocab_size=50,
        max_position_embeddings=16,
    )
    vision = dict(
        hidden_size=24, num_hidden_layers=3, num_attention_heads=2, intermediate_size=40, image_size=8, patch_size=4
    )
    return {
        "t5": lambda: t.T5ForConditionalGeneration(
            t.T5Config(
                d_model=32,
                d_kv=8,
                num_layers=2,
                num_decoder_layers=3,
                num_heads=4,
                d_ff=48,
                vocab_size=50,
                feed_forward_proj="gated-gelu",
            )
        ),
        "bart": lambda: t.BartForConditionalGeneration(t.BartConfig(**sizes, **seq)),
        "whisper": lambda: t.WhisperForConditionalGeneration(
            t.WhisperConfig(
                **sizes,
                vocab_size=60,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
                num_mel_bins=8,
                max_source_positions=8,
                max_target_positions=8,
            )
        ),
        "clip": lambda: t.CLIPModel(t.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)),
        "siglip": lambda: t.SiglipModel(t.SiglipConfig(text_config=text, vision_config=vision)),
    }[name]()


@pytest.mark.parametrize("name", ["t5", "bart", "whisper", "clip", "siglip"])
def test_two_chains_are_drafted_and_analyse_as_the_shipped_family(tmp_path, name, capsys):
    """An encoder-decoder's stacks (the decoder's cross-attention as q_cross ... o_cross) and a
    two-tower model's towers are drafted from the names; the draft passes its self-check and gives the
    shipped family's numbers."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _seq2seq(name)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(tmp_path / "m")
    capsys.readouterr()
    assert main(["arch", "infer", str(tmp_path / "m"), "--out", str(tmp_path / "draft.json")]) == 0
    err = capsys.readouterr().err
    draft = json.loads((tmp_path / "draft.json").read_text())
    assert "self-check on this checkpoint: ok" in err
    if name in ("clip", "siglip"):
        assert set(draft["towers"]) == {"text", "vision"}
        drafted = specbound.analyze(tmp_path / "m", threads=1, arch_spec=tmp_path / "draft.json")
        shipped = specbound.analyze(tmp_path / "m", threads=1)
        assert drafted.all_bounds() == shipped.all_bounds()
    else:
        assert list(draft["stacks"]) == ["encoder", "decoder"]
        assert {"q_cross", "k_cross", "v_cross", "o_cross"} <= set(draft["stacks"]["decoder"]["tensors"])
        assert not any(r.endswith("_cross") for r in draft["stacks"]["encoder"]["tensors"])
        drafted = specbound.analyze(tmp_path / "m", threads=1, arch_spec=tmp_path / "draft.json")
        shipped = specbound.analyze(tmp_path / "m", threads=1)
        assert drafted.all_bounds() == shipped.all_bounds()
        assert list(drafted.matrices["role"]) == list(shipped.matrices["role"])


def test_a_decoder_whose_second_attention_is_unnamed_is_refused_naming_it(tmp_path, capsys):
    shapes = {
        **_layers("encoder.block.{}", META),
        **_layers("decoder.block.{}", {**META, "other_attention.q.weight": (8, 8), "other_attention.k.weight": (8, 8)}),
    }
    folder = _fake(tmp_path / "m", shapes, **CONFIG)
    capsys.readouterr()
    assert main(["arch", "infer", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "write the spec by hand" in err
    assert "other_attention" in err


def test_a_one_layer_stack_is_refused_naming_it(tmp_path, capsys):
    """A decoder of one layer looks like a wrapper around its sub-blocks (decoder.block.0.layer.{0,1,2}):
    refused in one line that says so, not as a decoder without cross-attention."""
    torch = pytest.importorskip("torch")
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    t.T5ForConditionalGeneration(
        t.T5Config(d_model=32, d_kv=8, num_layers=2, num_decoder_layers=1, num_heads=4, d_ff=48, vocab_size=50)
    ).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    assert main(["arch", "infer", str(tmp_path / "m")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "decoder.block.0.layer" in err and "one layer" in err
