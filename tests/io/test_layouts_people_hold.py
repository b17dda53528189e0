"""Artifacts as people hold them: the older sentence-transformers layout (modules.json naming
0_Transformer/), a whole pickled module (torch.save(model)), and a tokenizer-only folder."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file
from support.same_numbers import assert_close_tree, assert_same_numbers, numbers

import specbound
from specbound.errors import SpecboundError


def _sentence_transformers_folder(tiny_bert_dir, root, module_path="0_Transformer"):
    shutil.copytree(tiny_bert_dir, root / module_path)
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 16}))
    (root / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": module_path, "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            ]
        )
    )
    (root / "config_sentence_transformers.json").write_text("{}")
    return root


def test_the_older_sentence_transformers_layout_follows_modules_json(tiny_bert_dir, tmp_path):
    """The Transformer's numbers are the plain folder's; the Pooling module after it is named (model.modules and
    its assumption), which is all the two documents differ by."""

    root = _sentence_transformers_folder(tiny_bert_dir, tmp_path / "st")
    a, b = (numbers(specbound.analyze(folder, threads=1)) for folder in (root, tiny_bert_dir))
    assert a["model"].pop("modules") == [{"path": "1_Pooling", "type": "Pooling", "modes": []}]
    assert [e["name"] for e in a["assumptions"]] == [e["name"] for e in b["assumptions"]] + [
        "sentence_transformers_modules"
    ]
    a["assumptions"].pop()
    assert_close_tree(a, b)


@pytest.mark.parametrize("bad, expected", [("../elsewhere", "not a folder inside"), ("missing", "not a folder inside")])
def test_modules_json_cannot_leave_the_folder(tiny_bert_dir, tmp_path, bad, expected):
    root = _sentence_transformers_folder(tiny_bert_dir, tmp_path / "st")
    (tmp_path / "elsewhere").mkdir()
    doc = json.loads((root / "modules.json").read_text())
    doc[0]["path"] = bad
    (root / "modules.json").write_text(json.dumps(doc))
    with pytest.raises(SpecboundError, match=expected):
        specbound.analyze(root)


def test_a_modules_json_without_a_transformer_says_so(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "path": "1_Pooling", "type": "x.Pooling"}]))
    with pytest.raises(SpecboundError, match="names no Transformer module"):
        specbound.analyze(tmp_path)


def test_a_tokenizer_only_folder_says_it_holds_no_weights(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(
        SpecboundError,
        match=r"holds a tokenizer only \(tokenizer.json, tokenizer_config.json, "
        r"vocab.txt\): no model weights",
    ):
        specbound.analyze(tmp_path)


def test_a_whole_pickled_module_is_named_and_the_trusted_path_works(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    folder = tmp_path / "whole"
    folder.mkdir()
    config.save_pretrained(folder)
    torch.save(model, folder / "model.pt")
    with pytest.raises(SpecboundError) as info:
        specbound.analyze(folder / "model.pt")
    message = str(info.value)
    assert "whole pickled Python object" in message and "BertModel" in message
    assert "weights_only=False" in message and "\x1b" not in message and "\n" not in message
    trusted = specbound.analyze(torch.load(folder / "model.pt", weights_only=False), threads=1)
    assert_same_numbers(trusted, specbound.analyze(model, threads=1))


def _with_projection_heads(tiny_bert_dir, root, dense_out=(24, 8), activation="torch.nn.modules.activation.Tanh"):
    """The layout sentence-transformers saves (sentence-transformers is not installed here: written by hand as its
    save() writes it): the Transformer at the root (its own config.json, path ""), 1_Pooling, 2_Dense, 3_Dense
    (config.json and model.safetensors holding linear.weight (out, in) and linear.bias), 4_Normalize (no files)."""

    shutil.copytree(tiny_bert_dir, root)
    entries = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": False,
                "include_prompt": True,
            }
        )
    )
    rng = np.random.default_rng(0)
    n_in, weights = 32, {}
    for i, n_out in enumerate(dense_out, start=2):
        path = f"{i}_Dense"
        (root / path).mkdir()
        (root / path / "config.json").write_text(
            json.dumps({"in_features": n_in, "out_features": n_out, "bias": True, "activation_function": activation})
        )
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        save_file(
            {"linear.weight": w, "linear.bias": np.zeros(n_out, np.float32)}, str(root / path / "model.safetensors")
        )
        entries.append({"idx": i, "name": str(i), "path": path, "type": "sentence_transformers.models.Dense"})
        weights[path], n_in = w.astype(np.float64), n_out
    i = len(entries)
    (root / f"{i}_Normalize").mkdir()
    entries.append(
        {"idx": i, "name": str(i), "path": f"{i}_Normalize", "type": "sentence_transformers.models.Normalize"}
    )
    (root / "modules.json").write_text(json.dumps(entries, indent=2))
    (root / "config_sentence_transformers.json").write_text(
        json.dumps({"__version__": {"sentence_transformers": "3.0.1"}})
    )
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16, "do_lower_case": False}))
    return root, weights


def test_a_folder_with_its_own_config_still_reads_modules_json_and_reports_its_dense_heads(tiny_bert_dir, tmp_path):
    """modules.json is read even where the folder has its own config.json (it was not: 2_Dense and 3_Dense were lost
    without a word): each module after the Transformer is named in model.modules and the assumptions, a Dense matrix
    with its own norms (those of W^T, in x out, against a dense SVD) and activation; the Transformer's numbers are
    the plain folder's."""

    root, weights = _with_projection_heads(tiny_bert_dir, tmp_path / "st")
    a, plain = specbound.analyze(root, threads=1), specbound.analyze(tiny_bert_dir, threads=1)
    assert a.bounds == plain.bounds
    modules = a.model["modules"]
    assert [(m["path"], m["type"]) for m in modules] == [
        ("1_Pooling", "Pooling"),
        ("2_Dense", "Dense"),
        ("3_Dense", "Dense"),
        ("4_Normalize", "Normalize"),
    ]
    assert modules[0]["modes"] == ["mean_tokens"]
    for m in modules[1:3]:
        w = weights[m["path"]]
        s = np.linalg.svd(w, compute_uv=False)
        assert (m["in_features"], m["out_features"]) == (w.shape[1], w.shape[0])
        assert m["spectral_norm"] == pytest.approx(s[0], rel=1e-12)
        assert m["frobenius_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-12)
        assert m["nuclear_norm"] == pytest.approx(s.sum(), rel=1e-12) and m["rank"] == min(w.shape)
        assert m["activation"] == "tanh" and m["activation_lipschitz"] == 1.0
    effect = {e["name"]: e for e in a.assumptions}["sentence_transformers_modules"]
    assert effect["applies"] and effect["kind"] == "theorem"
    for needle in (
        "2_Dense (Dense 32 -> 24, tanh",
        "3_Dense (Dense 24 -> 8",
        "4_Normalize (Normalize)",
        "1_Pooling (Pooling: mean_tokens)",
        "not in the complexity",
        "sup |phi'| ||W||_2",
    ):
        assert needle in effect["effect"], needle
    assert "modules" not in plain.model and "sentence_transformers_modules" not in {
        e["name"] for e in plain.assumptions
    }


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda root: (root / "2_Dense" / "model.safetensors").unlink(), "has no weights"),
        (
            lambda root: (root / "2_Dense" / "config.json").write_text(
                '{"in_features": 32, "out_features": 25, "activation_function": "x"}'
            ),
            "linear.weight has shape \\(24, 32\\), but its config.json .* says \\(25, 32\\)",
        ),
        (
            lambda root: (root / "2_Dense" / "config.json").write_text('{"in_features": true, "out_features": 24}'),
            "in_features=True",
        ),
        (lambda root: (root / "2_Dense" / "config.json").write_text("[]"), "config.json is missing or not an object"),
    ],
)
def test_a_broken_dense_module_is_one_line(tiny_bert_dir, tmp_path, edit, expected):
    root, _ = _with_projection_heads(tiny_bert_dir, tmp_path / "st")
    edit(root)
    with pytest.raises(SpecboundError, match=expected) as err:
        specbound.analyze(root, threads=1)
    assert "\n" not in str(err.value)
