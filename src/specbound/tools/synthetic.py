"""Synthetic checkpoints with real layouts, written without torch: BERT-shaped random weights in
a Hugging Face folder (config.json + model.safetensors), for benchmarks, the Miniatures family and tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def write_bert_checkpoint(
    folder: str | Path, *, L: int, N: int, H: int, d_ff: int, vocab: int = 512, seed: int = 0
) -> Path:
    """A random BERT-shaped checkpoint (config.json + model.safetensors, float32) in ``folder``.

    Weights are Gaussian with std 0.02 (BERT's initialiser), plus the biases, LayerNorm parameters and
    embeddings a real checkpoint carries, so the loader's accounting is exercised too.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def gauss(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {
        "embeddings.word_embeddings.weight": gauss(vocab, N),
        "embeddings.position_embeddings.weight": gauss(64, N),
        "embeddings.token_type_embeddings.weight": gauss(2, N),
        "pooler.dense.weight": gauss(N, N),
        "pooler.dense.bias": np.zeros(N, np.float32),
        "embeddings.LayerNorm.weight": np.ones(N, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(N, np.float32),
    }
    linears = {
        "attention.self.query": (N, N),
        "attention.self.key": (N, N),
        "attention.self.value": (N, N),
        "attention.output.dense": (N, N),
        "intermediate.dense": (d_ff, N),
        "output.dense": (N, d_ff),
    }
    for layer in range(L):
        for name, (out_dim, in_dim) in linears.items():
            tensors[f"encoder.layer.{layer}.{name}.weight"] = gauss(out_dim, in_dim)
            tensors[f"encoder.layer.{layer}.{name}.bias"] = np.zeros(out_dim, np.float32)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[f"encoder.layer.{layer}.{ln}.weight"] = np.ones(N, np.float32)
            tensors[f"encoder.layer.{layer}.{ln}.bias"] = np.zeros(N, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "num_hidden_layers": L,
        "hidden_size": N,
        "num_attention_heads": H,
        "intermediate_size": d_ff,
        "hidden_act": "gelu",
        "vocab_size": vocab,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
