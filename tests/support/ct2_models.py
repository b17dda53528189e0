"""Tiny Hugging Face models (Whisper, LLaMA, BERT, BART) saved with save_pretrained and converted by
CTranslate2's own converter (``ctranslate2.converters.TransformersConverter``), for the CTranslate2
reader's tests.  The converter needs a tokenizer: a word-level one of the model's vocabulary."""

import shutil
import struct
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from specbound.io.ctranslate2_file import read_model_bin

N, H, KV, D_FF, VOCAB, POSITIONS = 32, 4, 2, 48, 64, 16


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    import transformers

    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="t1", eos_token="t2"
    ).save_pretrained(str(folder))


def hf_model(kind: str, folder: Path, seed: int = 0, *, converter_keys: bool = True):
    """Save a tiny ``kind`` model in ``folder`` (float32 weights drawn N(0, 0.3)); returns the model.
    ``converter_keys``: add the config keys CTranslate2's converter reads and transformers 5 no longer
    writes (``position_embedding_type``, ``normalize_before``); False: the config as transformers saves it
    (what docs/formats.md's route starts from)."""
    import torch
    import transformers as t

    t.logging.set_verbosity_error()
    torch.manual_seed(seed)
    stacks = dict(
        d_model=N,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=H,
        decoder_attention_heads=H,
        encoder_ffn_dim=D_FF,
        decoder_ffn_dim=D_FF,
    )
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    if kind == "whisper":
        model = t.WhisperForConditionalGeneration(
            t.WhisperConfig(
                **stacks, **special, vocab_size=VOCAB, num_mel_bins=8, max_source_positions=8, max_target_positions=8
            )
        )
    elif kind == "llama":
        model = t.LlamaForCausalLM(
            t.LlamaConfig(
                hidden_size=N,
                intermediate_size=D_FF,
                num_hidden_layers=2,
                num_attention_heads=H,
                num_key_value_heads=KV,
                vocab_size=VOCAB,
                max_position_embeddings=24,
            )
        )
    elif kind == "bert":
        model = t.BertModel(
            t.BertConfig(
                vocab_size=VOCAB,
                hidden_size=N,
                num_hidden_layers=2,
                num_attention_heads=H,
                intermediate_size=D_FF,
                max_position_embeddings=POSITIONS,
            )
        )
        if converter_keys:
            model.config.position_embedding_type = "absolute"  # the converter asks for it; transformers 5 has none
    elif kind == "roberta":
        model = t.RobertaModel(
            t.RobertaConfig(
                vocab_size=VOCAB,
                hidden_size=N,
                num_hidden_layers=2,
                num_attention_heads=H,
                intermediate_size=D_FF,
                pad_token_id=1,
                max_position_embeddings=POSITIONS + 2,
            )
        )
        if converter_keys:
            model.config.position_embedding_type = "absolute"
    elif kind == "bart":
        model = t.BartForConditionalGeneration(
            t.BartConfig(**stacks, **special, vocab_size=VOCAB, max_position_embeddings=POSITIONS)
        )
        if converter_keys:
            model.config.normalize_before = False  # as above
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(str(folder))
    if kind != "whisper":
        save_tokenizer(folder, VOCAB)
    return model


def convert(hf_folder: Path, out: Path, quantization: str | None = None) -> Path:
    """``hf_folder`` converted by CTranslate2's converter into ``out`` (a faster-whisper-style folder)."""
    import ctranslate2

    ctranslate2.converters.TransformersConverter(str(hf_folder)).convert(
        str(out), quantization=quantization, force=True
    )
    return out


def rewrite_model_bin(src: Path, dst: Path, edit) -> Path:
    """The CTranslate2 folder ``src`` copied to ``dst`` with its model.bin re-serialized in the
    binary layout (version 6) after ``edit(variables, aliases)``: ``variables`` a list of
    ``[name, shape, dtype id, bytes]`` in file order (duplicates allowed), ``aliases`` a list of
    ``[alias, target]``."""

    spec, variables, aliases = read_model_bin(src / "model.bin")
    data = (src / "model.bin").read_bytes()
    listed = [[n, v.shape, v.dtype, data[v.start : v.start + v.n_bytes]] for n, v in variables.items()]
    alias_list = [[a, t] for a, t in aliases.items()]
    edit(listed, alias_list)

    def text(value: str) -> bytes:
        raw = value.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = [struct.pack("<I", 6), text(spec), struct.pack("<I", 1), struct.pack("<I", len(listed))]
    for name, shape, dtype, raw in listed:
        out += [
            text(name),
            struct.pack("<B", len(shape)),
            *(struct.pack("<I", d) for d in shape),
            struct.pack("<B", dtype),
            struct.pack("<I", len(raw)),
            raw,
        ]
    out.append(struct.pack("<I", len(alias_list)))
    for alias, target in alias_list:
        out += [text(alias), text(target)]
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    (dst / "model.bin").write_bytes(b"".join(out))
    return dst
