"""Tiny BERT-named checkpoints written with numpy + safetensors (no torch: fast, and the tests
that use them prove the analysis path needs neither torch nor transformers).

The tensor names and the ``(out, in)`` layout are those of Hugging Face's ``BertModel``; biases,
LayerNorm and embedding tensors are included so that the checkpoint's tensor accounting is real.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

ROLE_NAMES = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "ff_in": "intermediate.dense",
    "ff_out": "output.dense",
}


def write_tiny_bert(
    folder, *, seed: int, L: int = 2, N: int = 16, H: int = 4, d_ff: int = 24, std: float = 0.3
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of a random BERT encoder to ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = {"q": (N, N), "k": (N, N), "v": (N, N), "o": (N, N), "ff_in": (d_ff, N), "ff_out": (N, d_ff)}
    tensors = {
        "embeddings.word_embeddings.weight": rng.standard_normal((30, N)).astype(np.float32),
        "embeddings.LayerNorm.weight": np.ones(N, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(N, np.float32),
    }
    for layer in range(L):
        for role, (out_dim, in_dim) in shapes.items():
            name = f"encoder.layer.{layer}.{ROLE_NAMES[role]}"
            tensors[f"{name}.weight"] = (std * rng.standard_normal((out_dim, in_dim))).astype(np.float32)
            tensors[f"{name}.bias"] = np.zeros(out_dim, np.float32)
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
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def row_weights(folder, layer: int) -> dict[str, np.ndarray]:
    """One layer's role matrices in row-vector orientation, float64 (the tests' dense reference)."""

    w = load_file(str(Path(folder) / "model.safetensors"))
    return {role: w[f"encoder.layer.{layer}.{name}.weight"].astype(np.float64).T for role, name in ROLE_NAMES.items()}
