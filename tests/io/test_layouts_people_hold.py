"""Artifacts as people hold them: the older sentence-transformers layout (modules.json naming
0_Transformer/), a whole pickled module (torch.save(model)), and a tokenizer-only folder."""

import json
import shutil

import pytest

import specbound
from specbound.errors import SpecboundError
from support.same_numbers import assert_same_numbers


def _sentence_transformers_folder(tiny_bert_dir, root, module_path="0_Transformer"):
    shutil.copytree(tiny_bert_dir, root / module_path)
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 16}))
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": module_path, "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (root / "config_sentence_transformers.json").write_text("{}")
    return root


def test_the_older_sentence_transformers_layout_follows_modules_json(tiny_bert_dir, tmp_path):
    root = _sentence_transformers_folder(tiny_bert_dir, tmp_path / "st")
    assert_same_numbers(specbound.analyze(root, threads=1), specbound.analyze(tiny_bert_dir, threads=1))


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
    with pytest.raises(SpecboundError, match=r"holds a tokenizer only \(tokenizer.json, tokenizer_config.json, "
                                             r"vocab.txt\): no model weights"):
        specbound.analyze(tmp_path)


def test_a_whole_pickled_module_is_named_and_the_trusted_path_works(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=16)
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
