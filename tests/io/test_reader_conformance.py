"""Every reader, one check (support.conformance.check_reader): for each row of io/formats.py a tiny model
written in that format keeps the Checkpoint contract and is the model of the float safetensors folder it
was written from: the same dimensions, role matrices, notes and numbers.  A new format is a row there and a
writer here (test_every_format_has_a_writer fails until it has one)."""

import shutil
from pathlib import Path

import pytest
from support.conformance import check_reader
from support.ct2_models import convert, hf_model
from support.gguf_convert import write_converted

from specbound.io.formats import FORMATS

DATA = Path(__file__).resolve().parent / "data"
BERT = DATA / "tiny_bert_safetensors"


def _safetensors(tmp_path):
    return BERT / "model.safetensors", BERT, {}  # the file named directly


def _pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    folder = tmp_path / "pytorch"
    folder.mkdir()
    shutil.copy(BERT / "config.json", folder)
    torch.save(load_file(str(BERT / "model.safetensors")), folder / "pytorch_model.bin")
    return folder, BERT, {}


def _tf(tmp_path):
    pytest.importorskip("h5py")
    return DATA / "tiny_bert_tf", BERT, {}


def _flax(tmp_path):
    pytest.importorskip("msgpack")
    return DATA / "tiny_bert_flax", BERT, {}


def _onnx(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("torch")
    import transformers
    from support.onnx_graphs import export

    model = transformers.BertModel.from_pretrained(str(BERT)).eval()
    return export(model, tmp_path / "onnx", False, True), BERT, {}


def _gguf(tmp_path):
    pytest.importorskip("gguf")
    torch = pytest.importorskip("torch")
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=64,
            max_position_embeddings=24,
        )
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(str(tmp_path / "hf"))
    # llama and llama_gguf: the same blocks under two family names (tests/io/test_gguf.py's tolerance)
    return write_converted(tmp_path / "model.gguf", model, "llama"), tmp_path / "hf", {"family": False, "rel": 1e-9}


def _ctranslate2(tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")

    hf_model("bert", tmp_path / "hf")
    return convert(tmp_path / "hf", tmp_path / "ct2"), tmp_path / "hf", {}


WRITERS = {
    "safetensors": _safetensors,
    "pytorch": _pytorch,
    "tf": _tf,
    "flax": _flax,
    "onnx": _onnx,
    "gguf": _gguf,
    "ctranslate2": _ctranslate2,
}


def test_every_format_has_a_writer():
    assert sorted(WRITERS) == sorted(f.name for f in FORMATS)


@pytest.mark.parametrize("name", [f.name for f in FORMATS])
def test_every_reader_reads_the_model_of_its_safetensors_twin(name, tmp_path):
    source, twin, options = WRITERS[name](tmp_path)
    check_reader(source, twin, **options)
