"""Quantized and CTranslate2 repositories on a local stand-in for the Hub: only the files the
analysis reads are fetched (config.json and model.bin of a CTranslate2 repository, not its
vocabulary; config.json and the safetensors of a GPTQ one), and a streamed GPTQ repository reads its
packed integers by byte ranges, to the local folder's numbers."""

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

from support import quant_writers as qw  # noqa: E402
from support.ct2_models import convert, hf_model
from support.hub_server import HubServer  # noqa: E402
from support.same_numbers import assert_same_numbers  # noqa: E402

import specbound  # noqa: E402
from specbound.errors import SpecboundError  # noqa: E402


def test_gptq_repository_fetched_and_streamed(tmp_path, hub_env):
    model = qw.tiny_llama(tmp_path / "hf")
    folder = tmp_path / "gptq"
    qw.write_gptq(model, folder, 4, 32, False, True)
    (folder / "README.md").write_text("a model card")
    local = specbound.analyze(folder, threads=1)
    with HubServer({"org/gptq": folder}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        streamed = specbound.analyze("org/gptq", stream=True, threads=1, jobs=1)
        assert_same_numbers(local, streamed)
        fetched = specbound.analyze("org/gptq", threads=1)
        assert hub.fetched() == {"config.json", "model.safetensors"}
    assert_same_numbers(local, fetched)
    assert any(e["name"] == "quantized_weights" and "GPTQ" in e["effect"] for e in fetched.assumptions)


def test_ctranslate2_repository_fetches_config_and_model_bin(tmp_path, hub_env):
    pytest.importorskip("ctranslate2")

    hf_model("whisper", tmp_path / "hf")
    folder = convert(tmp_path / "hf", tmp_path / "ct2")
    (folder / "vocabulary.txt").write_text("a\nb\n")
    local = specbound.analyze(folder, threads=1)
    with HubServer({"org/faster-whisper-tiny": folder}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(SpecboundError, match="never streamed"):
            specbound.analyze("org/faster-whisper-tiny", stream=True, threads=1)
        fetched = specbound.analyze("org/faster-whisper-tiny", threads=1)
        assert hub.fetched() == {"config.json", "model.bin"}
    assert_same_numbers(local, fetched)
