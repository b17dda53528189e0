"""PEFT LoRA adapters, written by the real ``peft`` package on tiny transformers models (float64, so
PEFT's own merge and specbound's agree to rounding): the adapter analysed with its base equals the
analysis of ``merge_and_unload()``'s saved model, and its from-init tables (``W - W0`` with the base
as ``W0``, computed from the update's factors) equal a dense reference of ``W - W0``: numpy SVDs of
the dense differences taken from the torch modules, and specbound's own dense ``--init`` path."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file, save_file
from support.hub_server import HubServer, isolate_hub_environment
from support.peft_models import build_adapter, tiny_bert, tiny_gpt2

import specbound
import specbound.pipeline as pipeline
from specbound import SpecboundError
from specbound.cli import main
from specbound.compute.low_rank import low_rank_spectrum
from specbound.compute.rotary import rotations
from specbound.compute.spectra import dense_spectrum
from specbound.io import open_checkpoint
from specbound.pipeline import open_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

MERGED_REL = 1e-12  # the adapter merged by specbound vs by PEFT, both in float64
DENSE_REL = 1e-9  # the factored W - W0 vs dense SVDs of the difference
DELTA_COLUMNS = [
    "delta_rank",
    "delta_spectral_norm",
    "delta_frobenius_norm",
    "delta_norm_2_1",
    "delta_norm_1_1",
    "delta_p_star",
    "delta_contribution",
]


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(cfg)


_bert, _gpt2 = tiny_bert, tiny_gpt2


def analyze(source, **options):
    return specbound.analyze(source, threads=1, jobs=1, **options)


def assert_same_analysis(ours, theirs, rel):
    """Every bound and every numeric column of the matrices table agree to ``rel``."""
    for name, value in theirs.all_bounds.items() if isinstance(theirs.all_bounds, dict) else []:
        assert ours.all_bounds[name] == pytest.approx(value, rel=rel, abs=1e-300), name
    assert ours.bounds == pytest.approx(theirs.bounds, rel=rel)
    a, b = ours.matrices, theirs.matrices
    assert list(a["role"]) == list(b["role"]) and list(a["layer"]) == list(b["layer"])
    for col in a.columns:
        if col.startswith("delta_") or a[col].dtype.kind != "f" or col == "sv_rel_error_bound":
            continue
        np.testing.assert_allclose(a[col].to_numpy(float), b[col].to_numpy(float), rtol=rel, atol=1e-300, err_msg=col)


def assert_same_deltas(ours, reference, rel):
    """The from-init bounds and every ``delta_`` column agree to ``rel`` (ranks exactly)."""
    assert ours.from_init == pytest.approx(reference.from_init, rel=rel)
    for col in DELTA_COLUMNS:
        x, y = ours.matrices[col].to_numpy(float), reference.matrices[col].to_numpy(float)
        if col == "delta_rank":
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=rel, atol=1e-12, err_msg=col)
    for col in (c for c in ours.layers.columns if c.startswith("delta_")):
        np.testing.assert_allclose(
            ours.layers[col].to_numpy(float), reference.layers[col].to_numpy(float), rtol=rel, err_msg=col
        )


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """LLaMA (grouped-query, gated): every projection adapted, the embedding too, lm_head saved whole."""
    return build_adapter(
        tmp_path_factory.mktemp("lora_llama"),
        _llama,
        r=3,
        lora_alpha=5,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens"],
        modules_to_save=["lm_head"],
    )


@pytest.fixture(scope="module")
def llama_results(llama):
    base, adapter, merged = llama
    return analyze(adapter, base=base), analyze(merged), analyze(merged, init=base, method="dense")


def test_llama_adapter_merged_equals_peft_merge(llama_results):
    ours, merged, _ = llama_results
    assert_same_analysis(ours, merged, MERGED_REL)


def test_every_tensor_read_is_peft_merged_tensor(llama):
    """Tensor by tensor, the adapter read with its base is PEFT's merged model: the adapted
    projections, the adapted embedding (on its saved base_layer), lm_head from modules_to_save and
    every tensor the adapter leaves alone."""

    base, adapter, merged = llama
    theirs = load_file(str(merged / "model.safetensors"))
    ckpt = open_checkpoint(adapter, base=base)
    try:
        assert sorted(ckpt.names) == sorted(theirs)
        for name in ckpt.names:
            np.testing.assert_allclose(ckpt.read(name), theirs[name], rtol=MERGED_REL, atol=1e-15, err_msg=name)
        base_tensors = load_file(str(base / "model.safetensors"))
        changed = {n for n in ckpt.names if not np.array_equal(base_tensors[n], theirs[n])}
        assert {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.up_proj.weight"} <= changed
    finally:
        ckpt.close()


def test_llama_adapter_from_init_equals_dense_init_path(llama_results):
    ours, _, dense = llama_results
    assert ours.from_init is not None and all(v > 0 for v in ours.from_init.values())
    assert_same_deltas(ours, dense, DENSE_REL)


def _dense_deltas(model, base, layers, heads, kv_heads, turns=None):
    """``(layer, head, role) -> W - W0`` as dense numpy matrices, read from the torch modules (row-vector
    orientation: QK^h = W_Q^h.T W_K^g, OV^h = W_V^g.T W_O^h, a Linear's matrix is its weight.T); with
    ``turns`` (the rotations ``M(delta)`` of every offset, ``(2P - 1, d_h, d_h)``) each QK difference is the
    stack ``W_Q^h.T M(delta) W_K^g - W_Q0^h.T M(delta) W_K0^g`` over the offsets."""

    def w(m, name):
        return dict(m.named_parameters())[name].detach().numpy().astype(np.float64)

    out = {}
    for layer in range(layers):
        pre = f"model.layers.{layer}."
        get = {
            m: {
                p: w(mod, pre + p + ".weight")
                for p in (
                    "self_attn.q_proj",
                    "self_attn.k_proj",
                    "self_attn.v_proj",
                    "self_attn.o_proj",
                    "mlp.gate_proj",
                    "mlp.up_proj",
                    "mlp.down_proj",
                )
            }
            for m, mod in (("w", model), ("w0", base))
        }
        q, k, v, o = (("self_attn." + x) for x in ("q_proj", "k_proj", "v_proj", "o_proj"))
        n = get["w"][q].shape[1]
        d = get["w"][q].shape[0] // heads
        for h in range(heads):
            g = h // (heads // kv_heads)
            rows, kv = slice(h * d, (h + 1) * d), slice(g * d, (g + 1) * d)
            # rotary: the head's difference at every offset, (2P - 1, N, N); else one matrix
            qk = [
                get[m][q][rows].T @ get[m][k][kv]
                if turns is None
                else np.einsum("ai,tij,jb->tab", get[m][q][rows].T, turns, get[m][k][kv])
                for m in ("w", "w0")
            ]
            ov = [get[m][v][kv].T @ get[m][o][:, rows].T for m in ("w", "w0")]
            out[(layer, h, "QK")], out[(layer, h, "OV")] = qk[0] - qk[1], ov[0] - ov[1]
            assert qk[0].shape[-2:] == (n, n)
        for role, p in (("FF_gate", "mlp.gate_proj"), ("FF_up", "mlp.up_proj"), ("FF_out", "mlp.down_proj")):
            out[(layer, None, role)] = (get["w"][p] - get["w0"][p]).T
    return out


def test_llama_from_init_table_equals_numpy_svd_of_the_dense_difference(llama, llama_results):
    """Every ``delta_`` column against numpy on the dense ``W - W0`` from the torch modules; a rotary QK
    head's at every offset (docs/theory.md 3c, 3k): never below the largest, the spectral norm its exact
    maximum (the offset-0 value alone was up to 1.77x low on a LLaMA adapter)."""

    base, _, merged = llama
    ours = llama_results[0]
    load = lambda f: transformers.LlamaForCausalLM.from_pretrained(f, dtype=torch.float64)  # noqa: E731
    layout = open_model(merged).rotary
    turns = rotations(layout, 24 // 4, layout.offsets)
    deltas = _dense_deltas(load(merged), load(base), 2, 4, 2, turns=turns)
    rows = ours.matrices
    assert len(rows) == len(deltas)
    for _, row in rows.iterrows():
        key = (int(row["layer"]), None if pd.isna(row["head"]) else int(row["head"]), row["role"])
        stack = deltas[key] if key[2] == "QK" else deltas[key][None]
        s = np.linalg.svd(stack, compute_uv=False)
        tau = ours.options["rank_tol"] * stack.shape[-1] * np.maximum(s[:, 0], 1.0)
        expected = {
            "delta_spectral_norm": s[:, 0],
            "delta_frobenius_norm": np.sqrt(np.sum(s**2, axis=1)),
            "delta_norm_2_1": np.linalg.norm(stack, axis=1).sum(axis=1),
            "delta_norm_1_1": np.abs(stack).sum(axis=(1, 2)),
        }
        ranks = np.count_nonzero(s > tau[:, None], axis=1)
        for col, value in expected.items():
            if key[2] == "QK":  # a bound at every offset: never below the largest; the spectral norm exact
                assert row[col] >= value.max() * (1 - DENSE_REL), (key, col)
                assert col != "delta_spectral_norm" or row[col] == pytest.approx(value.max(), rel=DENSE_REL)
            else:
                assert row[col] == pytest.approx(value[0], rel=DENSE_REL), (key, col)
        assert row["delta_rank"] >= ranks.max(), key
        # the update's rank: r per adapted side (QK, OV: both sides adapted, 2r; a feed-forward matrix: r)
        assert row["delta_rank"] == (6 if key[2] in ("QK", "OV") else 3), key
    # the offset-0 (rotation-blind) spectral norm is below the maximum over offsets on some head
    qk = [k for k in deltas if k[2] == "QK"]
    ratios = [
        np.linalg.svd(deltas[k], compute_uv=False)[:, 0].max()
        / np.linalg.svd(deltas[k][layout.max_positions - 1], compute_uv=False)[0]
        for k in qk
    ]
    assert max(ratios) > 1.05


def test_llama_adapter_records_name_the_adapter_and_its_base(llama, llama_results):
    base, adapter, _ = llama
    ours = llama_results[0]
    doc = json.loads(ours.to_json())
    record = doc["model"]["adapter"]
    assert record["peft_type"] == "LORA" and record["r"] == 3 and record["lora_alpha"] == 5
    assert record["ranks"] == [3] and record["scales"] == [pytest.approx(5 / 3)]
    assert record["base"] == str(base) and record["path"] == str(adapter)
    assert "model.layers.1.mlp.down_proj.weight" in record["adapted_tensors"]
    # lm_head (modules_to_save) and the adapted embedding's base_layer, which PEFT saves beside its factors
    assert record["replaced_tensors"] == ["lm_head.weight", "model.embed_tokens.weight"]
    assert "model.embed_tokens.weight" in record["adapted_tensors"]
    assert doc["options"]["init"] == str(base)
    assert sorted(record["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens"]
    )


def test_the_factored_path_forms_no_dense_difference(llama, monkeypatch):
    """With the base as W0 the differences come from the factors: the dense W - W0 routine is never
    called (it would materialise B A)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the dense difference path was used")

    monkeypatch.setattr(pipeline, "difference_spectra", refuse)
    base, adapter, _ = llama
    assert analyze(adapter, base=base).from_init is not None


@pytest.mark.parametrize("rslora", [False, True], ids=["lora", "rslora"])
def test_bert_adapter_plain_and_rslora(tmp_path, rslora):
    base, adapter, merged = build_adapter(
        tmp_path, _bert, seed=1, r=4, lora_alpha=3, use_rslora=rslora, target_modules=["query", "key", "value", "dense"]
    )
    scale = 3 / (2.0 if rslora else 4.0)
    ours = analyze(adapter, base=base)
    assert ours.model["adapter"]["scales"] == [pytest.approx(scale)]
    assert ours.model["adapter"]["use_rslora"] is rslora
    assert_same_analysis(ours, analyze(merged), MERGED_REL)
    assert_same_deltas(ours, analyze(merged, init=base, method="dense"), DENSE_REL)


def test_gpt2_fan_in_fan_out_fused_qkv(tmp_path):
    """GPT-2 stores Conv1D weights as (in, out) and its qkv fused: PEFT's fan_in_fan_out update."""
    base, adapter, merged = build_adapter(
        tmp_path, _gpt2, seed=2, r=2, lora_alpha=4, fan_in_fan_out=True, target_modules=["c_attn", "c_proj", "c_fc"]
    )
    ours = analyze(adapter, base=base)
    assert ours.model["adapter"]["fan_in_fan_out"] is True
    assert_same_analysis(ours, analyze(merged), MERGED_REL)
    assert_same_deltas(ours, analyze(merged, init=base, method="dense"), DENSE_REL)


def _t5():
    return transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            d_model=32, d_kv=8, num_layers=1, num_decoder_layers=2, num_heads=4, d_ff=48, vocab_size=50
        )
    )


def _qwen3():
    return transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(
            vocab_size=40,
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=32,
        )
    )


def _phi3():
    return transformers.Phi3ForCausalLM(
        transformers.Phi3Config(
            vocab_size=40,
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=32,
            pad_token_id=0,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def _clip():
    return transformers.CLIPModel(
        transformers.CLIPConfig(
            text_config=dict(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                intermediate_size=48,
                vocab_size=50,
                max_position_embeddings=16,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=0,
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
    )


LAYOUTS = {  # builder, targets: what each case's layout puts between a stored tensor and a matrix
    "t5_cross_attention": (_t5, ["q", "v", "wo"]),  # the decoder's cross-attention q and v too
    "qwen3_qk_norm": (_qwen3, ["q_proj", "k_proj", "down_proj"]),  # a QK row is the stacked q, k factors
    "phi3_fused_qkv_gate_up": (_phi3, ["qkv_proj", "gate_up_proj", "o_proj"]),
    "clip_two_towers": (_clip, ["q_proj", "v_proj", "fc1"]),
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_other_layouts(tmp_path, monkeypatch, case):
    make, targets = LAYOUTS[case]
    base, adapter, merged = build_adapter(tmp_path, make, seed=4, r=2, lora_alpha=4, target_modules=targets)
    dense = analyze(merged, init=base, method="dense")
    theirs = analyze(merged)
    monkeypatch.setattr(pipeline, "difference_spectra", None)  # every layer from the factors
    ours = analyze(adapter, base=base)
    pairs = (
        [(ours, theirs, dense)]
        if hasattr(ours, "matrices")
        else [(ours[t], theirs[t], dense[t]) for t in ("text", "vision")]
    )
    for one, merged_one, dense_one in pairs:
        assert_same_analysis(one, merged_one, MERGED_REL)
        assert_same_deltas(one, dense_one, DENSE_REL)
        assert max(one.matrices["delta_rank"]) > 0


def test_pickled_adapter_and_the_base_it_names(tmp_path):
    """adapter_model.bin (read with weights_only=True) and, without base, the base_model_name_or_path
    the adapter names when it is a folder here."""
    base, adapter, merged = build_adapter(
        tmp_path, _bert, seed=3, safe=False, r=2, lora_alpha=2, target_modules=["query", "value"]
    )
    assert (adapter / "adapter_model.bin").is_file() and not (adapter / "adapter_model.safetensors").exists()
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    ours = analyze(adapter)
    assert ours.options["init"] == str(base) and ours.model["adapter"]["base_found"] == "as named"
    assert_same_analysis(ours, analyze(merged), MERGED_REL)


def _name_base(adapter, named):
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = named
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))


def test_a_relative_base_is_found_as_peft_finds_it(tmp_path, monkeypatch, capsys):
    """PEFT writes base_model_name_or_path as training gave it (relative to the training
    folder).  Tried in PEFT's order: as written from the current directory, then from the adapter's
    folder, then as a hub id (the offline cache: nothing fetched); the route used is recorded and
    printed."""

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    training = tmp_path / "training"
    base, adapter, _ = build_adapter(training, _bert, seed=4, r=2, lora_alpha=2, target_modules=["query"])
    reference = analyze(adapter, base=base)
    assert reference.model["adapter"]["base_found"] == "given"
    _name_base(adapter, "base")  # as training wrote it, run from the training folder
    monkeypatch.chdir(training)
    found = analyze(adapter)
    assert found.model["adapter"]["base_found"] == "as named" and found.model["adapter"]["base"] == "base"
    assert found.from_init == pytest.approx(reference.from_init, rel=1e-12)
    assert main(["analyze", str(adapter), "--jobs", "1", "--no-progress"]) == 0
    assert "merged into the base base (the path the adapter names, as written)" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # elsewhere: "base" is not here, so the adapter's folder is tried
    with pytest.raises(SpecboundError) as err:
        analyze(adapter)
    _one_line(err, "'base'", "neither a path here", "nor in the adapter's folder", "--base BASE")
    _name_base(adapter, "../base")
    found = analyze(adapter)
    assert found.model["adapter"]["base_found"] == "adapter folder"
    assert found.from_init == pytest.approx(reference.from_init, rel=1e-12)
    assert main(["analyze", str(adapter), "--jobs", "1", "--no-progress"]) == 0
    assert "(the path the adapter names, read from the adapter's folder)" in capsys.readouterr().out
    _name_base(adapter, "../../outside")  # from the adapter's folder: only within the folder holding it
    (tmp_path / "outside").mkdir()
    with pytest.raises(SpecboundError) as err:
        analyze(adapter)
    _one_line(err, "leads outside the folder holding the adapter", "--base BASE")


def test_factored_spectrum_equals_dense():
    rng = np.random.default_rng(0)
    for m, r, n in ((30, 3, 50), (7, 9, 5), (40, 1, 40)):
        left, right = rng.standard_normal((m, r)), rng.standard_normal((r, n))
        ours, ref = low_rank_spectrum(left, right), dense_spectrum(left @ right)
        k = min(r, m, n)
        np.testing.assert_allclose(ours.singular_values[:k], ref.singular_values[:k], rtol=1e-12)
        assert np.all(ref.singular_values[k:] < 1e-12 * ref.singular_values[0])
        assert ours.shape == (m, n)
        assert ours.norm_2_1 == pytest.approx(ref.norm_2_1, rel=1e-12)
        assert ours.norm_1_1 == pytest.approx(ref.norm_1_1, rel=1e-12)


# --- what is refused, in one line --------------------------------------------------------------


def _one_line(exc_info, *needles):
    message = str(exc_info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_dora_is_refused(tmp_path):
    _, adapter, _ = build_adapter(tmp_path, _bert, r=2, lora_alpha=2, target_modules=["query"], use_dora=True)
    with pytest.raises(SpecboundError) as err:
        analyze(adapter, base=tmp_path / "base")
    _one_line(err, "DoRA", "use_dora", "merge_and_unload")


def test_other_peft_types_are_refused(tmp_path):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _bert().double()
        model.save_pretrained(tmp_path / "base")
        peft.get_peft_model(
            model, peft.IA3Config(target_modules=["query", "value", "dense"], feedforward_modules=["dense"])
        ).save_pretrained(tmp_path / "ia3")
    with pytest.raises(SpecboundError) as err:
        analyze(tmp_path / "ia3", base=tmp_path / "base")
    _one_line(err, "IA3", "LoRA adapters only", "merge_and_unload")


def test_prompt_learning_is_refused(tmp_path):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _llama().double()
        peft.get_peft_model(
            model, peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
        ).save_pretrained(tmp_path / "prefix")
        model.save_pretrained(tmp_path / "base")
    with pytest.raises(SpecboundError) as err:
        analyze(tmp_path / "prefix", base=tmp_path / "base")
    _one_line(err, "PREFIX_TUNING", "LoRA adapters only", "prompt tuning")


def test_an_adapter_without_its_base_says_what_is_needed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, adapter, _ = build_adapter(tmp_path, _bert, r=2, lora_alpha=2, target_modules=["query"])
    cfg_path = adapter / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    for named, needles in (
        (None, ["names no base model", "--base BASE"]),
        ("nobody-here/not-a-cached-model", ["nobody-here/not-a-cached-model", "--base BASE"]),
        ("./no/such/folder", ["neither a path here", "nor in the adapter's folder, nor a hub id", "--base BASE"]),
    ):
        cfg["base_model_name_or_path"] = named
        cfg_path.write_text(json.dumps(cfg))
        with pytest.raises(SpecboundError) as err:
            analyze(adapter)
        _one_line(err, "PEFT LORA adapter (r=2, lora_alpha=2, targets query)", *needles)
        capsys.readouterr()
        assert main(["analyze", str(adapter)]) == 2
        out, text = capsys.readouterr()
        assert out == "" and len(text.strip().splitlines()) == 1 and "--base BASE" in text


def test_base_for_a_model_that_is_not_an_adapter_is_refused(tiny_bert_dir):
    with pytest.raises(SpecboundError) as err:
        analyze(tiny_bert_dir, base=tiny_bert_dir)
    _one_line(err, "--base", "not an adapter folder", "--init")


def test_an_adapter_for_another_model_is_refused(tmp_path, tiny_bert_dir):
    _, adapter, _ = build_adapter(tmp_path, _llama, r=2, lora_alpha=2, target_modules=["q_proj"])
    with pytest.raises(SpecboundError) as err:
        analyze(adapter, base=tiny_bert_dir)
    _one_line(err, "does not hold", "trained on another model", "--base BASE")


def test_cli_analyses_an_adapter(llama, capsys):
    base, adapter, _ = llama
    assert main(["analyze", str(adapter), "--base", str(base), "--format", "json", "--jobs", "1", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["adapter"]["base"] == str(base) and doc["from_init"]["spectral_adaptive"] > 0
    assert main(["analyze", str(adapter), "--base", str(base), "--jobs", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "LoRA adapter" in text and str(base) in text


def test_a_sweep_stores_the_adapter_with_its_base(llama, llama_results, tmp_path, capsys):
    base, adapter, _ = llama
    store = tmp_path / "store"
    assert main(["sweep", str(adapter), "--base", str(base), "--store", str(store), "--no-progress"]) == 0
    (record,) = [json.loads(p.read_text()) for p in store.glob("records/*/record.json")]
    analysis = record.get("analysis", record)
    assert analysis["model"]["adapter"]["base"] == str(base)
    assert analysis["from_init"] == pytest.approx(llama_results[0].from_init, rel=1e-12)


def test_the_base_it_names_as_a_hub_id_is_fetched(tmp_path, monkeypatch):
    """base_model_name_or_path a hub id not in the cache: fetched (from a local stand-in for the Hub)."""

    isolate_hub_environment(monkeypatch, tmp_path)
    base, adapter, _ = build_adapter(tmp_path, _bert, seed=5, r=2, lora_alpha=2, target_modules=["query", "dense"])
    reference = analyze(adapter, base=base)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "org/tiny-base"
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    with HubServer({"org/tiny-base": base}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        fetched = analyze(adapter)
        assert hub.fetched() == {"config.json", "model.safetensors"}
    assert fetched.model["adapter"]["base"] == "org/tiny-base" and fetched.model["adapter"]["base_found"] == "hub id"
    assert fetched.bounds == pytest.approx(reference.bounds, rel=1e-12)
    assert fetched.from_init == pytest.approx(reference.from_init, rel=1e-12)


@pytest.fixture
def small_adapter(tmp_path):
    base, adapter, _ = build_adapter(tmp_path, _bert, seed=6, r=2, lora_alpha=2, target_modules=["query"])
    return base, adapter


def _rewrite(adapter, edit):
    """Rewrite the adapter's safetensors file with ``edit(tensors)`` applied."""

    path = adapter / "adapter_model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize(
    "edit, needles",
    [
        (
            lambda t: t.update({k: v.reshape(*v.shape, 1, 1) for k, v in t.items() if "lora_A" in k}),
            ["convolution", "merge_and_unload"],
        ),
        (
            lambda t: t.update(
                {k.replace("lora_A.weight", "lora_magnitude_vector"): np.ones(24) for k in list(t) if "lora_A" in k}
            ),
            ["DoRA", "merge_and_unload"],
        ),
        (lambda t: [t.pop(k) for k in list(t) if "lora_B" in k], ["only one LoRA factor", "save_pretrained"]),
        (
            lambda t: t.update({k: np.concatenate([v, v], axis=0) for k, v in t.items() if "lora_A" in k}),
            ["do not multiply", "save_pretrained"],
        ),
        (lambda t: t.update({k: np.full_like(v, np.nan) for k, v in t.items() if "lora_B" in k}), ["NaN"]),
    ],
    ids=["conv", "dora_magnitudes", "one_factor", "ranks_differ", "nan"],
)
def test_malformed_adapters_are_one_line(small_adapter, edit, needles):
    base, adapter = small_adapter
    _rewrite(adapter, edit)
    with pytest.raises(SpecboundError) as err:
        analyze(adapter, base=base)
    _one_line(err, *needles)


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"r": 0}, ["r=0", "positive number"]),
        ({"lora_alpha": "sixteen"}, ["lora_alpha='sixteen'", "positive number"]),
        ({"use_dora": True}, ["use_dora", "DoRA"]),
        ({"layer_replication": [[0, 2]]}, ["layer_replication"]),
        ({"alpha_pattern": {"(": 3}}, ["not a regular expression"]),
    ],
    ids=["zero_rank", "alpha_text", "use_dora", "layer_replication", "bad_pattern"],
)
def test_config_values_are_checked(small_adapter, change, needles):
    base, adapter = small_adapter
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(SpecboundError) as err:
        analyze(adapter, base=base)
    _one_line(err, *needles)


def test_alpha_pattern_overrides_one_module(tmp_path):
    base, adapter, merged = build_adapter(
        tmp_path, _bert, seed=7, r=2, lora_alpha=2, target_modules=["query", "value"], alpha_pattern={"value": 6}
    )
    ours = analyze(adapter, base=base)
    assert ours.model["adapter"]["scales"] == [1.0, 3.0]
    assert_same_analysis(ours, analyze(merged), MERGED_REL)


def test_an_adapter_repository_is_fetched_with_its_base(tmp_path, monkeypatch):
    """An adapter and the base it names, both hub ids not in the cache: each fetched (only the
    adapter's config and safetensors, the base's config.json and safetensors)."""

    isolate_hub_environment(monkeypatch, tmp_path)
    base, adapter, _ = build_adapter(tmp_path, _bert, seed=8, r=2, lora_alpha=2, target_modules=["value"])
    reference = analyze(adapter, base=base)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "org/tiny-base"
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    (adapter / "adapter_model.bin").write_bytes(b"a duplicate the analysis never reads")
    with HubServer({"org/tiny-base": base, "org/tiny-lora": adapter}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        fetched = analyze("org/tiny-lora")
        assert hub.fetched() == {"config.json", "model.safetensors", "adapter_config.json", "adapter_model.safetensors"}
    assert fetched.from_init == pytest.approx(reference.from_init, rel=1e-12)


def test_a_folder_here_named_like_a_hub_id_comes_before_the_hub(tmp_path, monkeypatch):
    """As transformers does: a base_model_name_or_path that is both a folder from the current directory
    and a hub id is the folder, and the hub is not asked."""

    isolate_hub_environment(monkeypatch, tmp_path)
    base, adapter, _ = build_adapter(tmp_path, _bert, seed=6, r=2, lora_alpha=2, target_modules=["value"])
    (tmp_path / "org").mkdir()
    base.rename(tmp_path / "org" / "tiny-base")
    _name_base(adapter, "org/tiny-base")
    monkeypatch.chdir(tmp_path)
    with HubServer({}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        found = analyze(adapter)
        assert hub.fetched() == set()
    assert found.model["adapter"]["base_found"] == "as named"
    reference = analyze(adapter, base=tmp_path / "org" / "tiny-base")
    assert found.from_init == pytest.approx(reference.from_init, rel=1e-12)


def test_the_repr_of_an_adapter_analysis_says_it_is_one(llama_results):
    """The repr of an adapter's analysis says it is one."""
    ours, merged, _ = llama_results
    assert "LoRA" not in repr(merged)
    text = repr(ours)
    assert "LoRA adapter r=" in text and "merged into" in text and "from_init = W - W0" in text
