"""GGUF files of hybrids (llama.cpp's qwen3next, lfm2, nemotron_h, ...) and of state-space models are
refused in one line naming the layers whose tensors are linear-attention, state-space or
short-convolution blocks. Written by the ``gguf`` package's own GGUFWriter with the tensor names
llama.cpp's converter gives each architecture (gguf.MODEL_TENSORS)."""

import numpy as np
import pytest
from support.one_line import assert_api_error, assert_one_line_error, run_cli

from specbound.errors import index_ranges

gguf = pytest.importorskip("gguf")

# (architecture, layers holding the recurrent block, depth, the words naming it)
CASES = [
    ("qwen3next", [0, 1, 2, 4, 5, 6], 8, "state-space or linear-attention layers (blk.N.ssm_*)"),
    ("lfm2", [0, 1, 3], 4, "gated short-convolution layers (blk.N.shortconv.*)"),
    ("nemotron_h", [1], 3, "state-space or linear-attention layers (blk.N.ssm_*)"),
    ("mamba", [0, 1], 2, "state-space or linear-attention layers (blk.N.ssm_*)"),
    ("rwkv7", [0, 1], 2, "RWKV time-mixing layers (blk.N.time_mix_*)"),
]


def _write(path, arch, recurrent, depth):
    """A file of ``arch`` whose layers in ``recurrent`` hold the architecture's own recurrent tensors
    and the others its attention tensors (tiny float32 zeros)."""
    kind = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    names = [gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[kind]]
    block = [n for n in names if n.startswith("blk.{bid}.")]
    mixer = [n for n in block if any(x in n for x in ("ssm_", "shortconv.", "time_mix_"))]
    attention = [n for n in block if ".attn_" in n] or [n for n in block if n not in mixer][:2]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(depth)
    writer.add_embedding_length(8)
    for layer in range(depth):
        for name in mixer if layer in recurrent else attention:
            writer.add_tensor(name.format(bid=layer) + ".weight", np.zeros((2, 8), np.float32))
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch,recurrent,depth,words", CASES, ids=[c[0] for c in CASES])
def test_a_hybrid_gguf_is_refused_naming_its_layers(arch, recurrent, depth, words, tmp_path, capsys):
    path = _write(tmp_path / f"{arch}.gguf", arch, recurrent, depth)
    noun = "layer" if len(recurrent) == 1 else "layers"
    needles = [
        f"GGUF architecture {arch!r} is refused as a whole",
        f"{noun} {index_ranges(recurrent)} of {depth} are",
        words,
        "docs/families.md",
    ]
    line = assert_one_line_error(*run_cli(capsys, path), needles)
    assert assert_api_error(needles, path) == line.removeprefix("specbound: error: ")


def test_an_unsupported_architecture_without_recurrent_blocks_is_still_unsupported(tmp_path, capsys):
    path = _write(tmp_path / "x.gguf", "plamo", [], 2)
    assert_one_line_error(*run_cli(capsys, path), ["GGUF architecture 'plamo' is not supported"])
