"""Write flax_model.msgpack files with flax's own serializer (needs flax and jax in a scratch
environment): FlaxBertModel's parameter tree (Dense kernels (in, out), LayerNorm scale, embedding)
filled from the safetensors file; float32, bfloat16, and float32 with MAX_CHUNK_SIZE = 256 so that
arrays are stored as flax's chunked arrays.

    python write_flax_model_msgpack.py model.safetensors f32.msgpack bf16.msgpack chunked.msgpack
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from safetensors.numpy import load_file


def bert_tree(state: dict) -> dict:
    tree: dict = {}
    for name, value in state.items():
        if name.endswith("position_ids"):
            continue
        parts = name.split(".")
        leaf = parts.pop()
        if name.startswith("embeddings.") and name.endswith("_embeddings.weight"):
            leaf = "embedding"
        elif "LayerNorm" in name:
            leaf = {"weight": "scale", "bias": "bias"}[leaf]
        elif leaf == "weight":
            leaf, value = "kernel", value.T
        node = tree
        for part in parts:
            node = node.setdefault(part, {})
        node[leaf] = jnp.asarray(np.ascontiguousarray(value))
    return tree


def main(source: str, f32: str, bf16: str, chunked: str) -> None:
    tree = bert_tree(load_file(source))
    open(f32, "wb").write(serialization.to_bytes(tree))
    open(bf16, "wb").write(serialization.to_bytes(jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), tree)))
    serialization.MAX_CHUNK_SIZE = 256  # flax chunks arrays over this many bytes
    open(chunked, "wb").write(serialization.to_bytes(tree))


if __name__ == "__main__":
    main(*sys.argv[1:5])
