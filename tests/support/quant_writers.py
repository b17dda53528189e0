"""Quantized checkpoints of a tiny LLaMA, written the way each library writes them: compressed-tensors
by its own compressors; GPTQ and AWQ by packers transcribed from AutoGPTQ's ``QuantLinear.pack`` and
AutoAWQ's ``WQLinear_GEMM.from_linear`` (neither package installs here); MLX by mlx itself
(``write_mlx_native``) and by a packer of its layout (uint32 words, values little-endian in the bit
stream), which runs where mlx does not install.  Each returns the
dequantized weights the library computes, for the tests to compare with."""

import json
from pathlib import Path

import numpy as np

N, H, KV, D_FF, VOCAB = 64, 4, 2, 96, 64
PROJ = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def tiny_llama(folder: Path, seed: int = 0):
    """A tiny float32 LLaMA saved in ``folder``; returns the model."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=N,
            intermediate_size=D_FF,
            num_hidden_layers=2,
            num_attention_heads=H,
            num_key_value_heads=KV,
            vocab_size=VOCAB,
            max_position_embeddings=16,
        )
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(str(folder))
    return model


def _linears(model):
    return {
        f"model.layers.{i}.{p}": dict(model.named_modules())[f"model.layers.{i}.{p}"]
        for i in range(len(model.model.layers))
        for p in PROJ
    }


def _save(folder: Path, model, tensors: dict, quantization_config: dict, key: str = "quantization_config"):
    """The model's state dict with the quantized modules' weights replaced by ``tensors``."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for name in list(state):
        if name.endswith(".weight") and name[: -len(".weight")] in _linears(model):
            del state[name]
    state.update(
        {
            k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))).contiguous()
            for k, v in tensors.items()
        }
    )
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads(json.dumps(model.config.to_dict()))
    config[key] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))


# ----------------------------------------------------------------------------------- compressed-tensors


def write_compressed(model, folder: Path, args: dict, fmt: str) -> dict:
    """Every Linear of the blocks compressed by compressed-tensors' own compressor for ``fmt`` with
    the weight ``args`` (bfloat16 weights, scales from the library's calculate_qparams); returns
    name -> the library's decompressed weight (float64)."""
    import torch
    from compressed_tensors.compressors.naive_quantized.base import (
        FloatQuantizationCompressor,
        IntQuantizationCompressor,
    )
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    compressor = {
        "float-quantized": FloatQuantizationCompressor,
        "int-quantized": IntQuantizationCompressor,
        "pack-quantized": PackedQuantizationCompressor,
        "nvfp4-pack-quantized": NVFP4PackedCompressor,
    }[fmt]
    qargs = QuantizationArgs(**args)
    scheme = QuantizationScheme(targets=["Linear"], weights=qargs)
    tensors, expected = {}, {}
    for name, linear in _linears(model).items():
        w = linear.weight.detach().to(torch.bfloat16)
        out, n_in = w.shape
        if qargs.strategy == "tensor":
            lo, hi = w.min().reshape(1), w.max().reshape(1)
        elif qargs.strategy == "channel":
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        elif qargs.strategy in ("group", "tensor_group"):
            g = w.reshape(out, -1, qargs.group_size)
            lo, hi = g.amin(-1), g.amax(-1)
        else:
            r, c = qargs.block_structure
            b = w.reshape(out // r, r, n_in // c, c).transpose(1, 2)
            lo, hi = b.amin((-1, -2)), b.amax((-1, -2))
        state = {"weight": w}
        if fmt == "nvfp4-pack-quantized":
            state["weight_global_scale"] = generate_gparam(w.min(), w.max())
            scale, zp = calculate_qparams(lo, hi, qargs, global_scale=state["weight_global_scale"])
        else:
            scale, zp = calculate_qparams(lo, hi, qargs)
        state.update(weight_scale=scale, weight_zero_point=zp)
        compressed = compressor.compress(state, scheme)
        expected[f"{name}.weight"] = compressor.decompress(dict(compressed), scheme)["weight"].double().numpy()
        tensors.update({f"{name}.{k}": v for k, v in compressed.items()})
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=["lm_head"]).model_dump(
        mode="json"
    )
    config["quant_method"] = "compressed-tensors"
    _save(folder, model, tensors, config)
    return expected


# ----------------------------------------------------------------------------------------------- GPTQ


def gptq_pack_rows(intweight: np.ndarray, bits: int) -> np.ndarray:
    """AutoGPTQ's ``QuantLinear.pack`` loop (qlinear_cuda_old.py), transcribed: ``intweight``
    (rows, cols) of unsigned ``bits``-bit values packed along the rows into int32."""
    intweight = intweight.astype(np.uint32)
    qweight = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        if bits in (2, 4, 8):
            for j in range(i, i + 32 // bits):
                qweight[row] |= intweight[j] << (bits * (j - i))
            i += 32 // bits
            row += 1
        else:  # 3 bits
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i))
            i += 10
            qweight[row] |= intweight[i] << 30
            row += 1
            qweight[row] |= (intweight[i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 1)
            i += 10
            qweight[row] |= intweight[i] << 31
            row += 1
            qweight[row] |= (intweight[i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 2)
            i += 10
            row += 1
    return qweight.view(np.int32)


def autogptq_pack_zeros(zeros: np.ndarray, bits: int) -> np.ndarray:
    """AutoGPTQ's ``QuantLinear.pack`` of the zero points (qlinear_cuda_old.py, auto-gptq 0.7.1),
    transcribed: ``zeros -= 1``, cast to uint32 and ORed into the words along the output columns.  A
    zero point of 0 becomes ``0xFFFFFFFF`` (AutoGPTQ casts the float -1; here the integer, whose
    cast is defined), which sets its field and every later field of its word to all ones."""
    return gptq_pack_rows((zeros.astype(np.int64) - 1).astype(np.uint32).T, bits).T.copy()


def autogptq_unpack_zeros(qzeros: np.ndarray, bits: int, act_order: bool) -> np.ndarray:
    """The zero points AutoGPTQ's own dequantization uses (its torch path, the one that runs without
    CUDA), transcribed: each field plus 1, masked to ``bits`` by ``qlinear_cuda_old`` at 2, 4 and 8
    bits (``zeros = zeros + 1; zeros = torch.bitwise_and(zeros, (2**self.bits) - 1)``), not masked
    at 3 bits nor by ``qlinear_cuda``, the kernel ``dynamically_import_QuantLinear`` picks for
    act-order models with groups."""
    zeros = gptq_unpack_rows(qzeros.T.view(np.uint32), bits).T + 1
    return zeros if bits == 3 or act_order else zeros & (2**bits - 1)


def gptq_unpack_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of :func:`gptq_pack_rows`, word by word as AutoGPTQ's and GPTQModel's unpackers
    read (3 bits: the two values that straddle words joined from both)."""
    packed = packed.astype(np.uint64)
    rows = packed.shape[0] * 32 // bits
    out = np.zeros((rows, *packed.shape[1:]), dtype=np.int64)
    for k in range(rows):
        at = k * bits
        value = packed[at // 32] >> np.uint64(at % 32)
        if at % 32 + bits > 32:
            value |= packed[at // 32 + 1] << np.uint64(32 - at % 32)
        out[k] = (value & np.uint64(2**bits - 1)).astype(np.int64)
    return out


def gptqmodel_v2_to_v1(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """GPTQModel's ``convert_gptq_v2_to_v1_format_module`` (gptqmodel/utils/model.py, 7.7.0),
    transcribed: each int32 word minus ``0b0101...``, ``0x11111111`` or ``0x01010101`` at 2, 4 and 8
    bits (``module.qzeros.data -= ...``: a field of 0 borrows from the next); at 3 bits each field
    minus 1 modulo 8 (``_revert_gptq_v1_qzeros_correction``)."""
    if bits == 3:
        fields = gptq_unpack_rows(qzeros.T.view(np.uint32), 3)
        return gptq_pack_rows((fields - 1) & 7, 3).T.copy()
    offset = {2: 0b01010101010101010101010101010101, 4: 0x11111111, 8: 0x01010101}[bits]
    return ((qzeros.view(np.uint32).astype(np.int64) - offset) % 2**32).astype(np.uint32).view(np.int32)


def gptqmodel_v1_to_v2(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """GPTQModel's loader, ``convert_gptq_v1_to_v2_format_module`` (same file), transcribed: each
    int32 word plus the same offset (carries included; at 3 bits each field plus 1 modulo 8,
    ``_correct_gptq_v1_qzeros``)."""
    if bits == 3:
        fields = gptq_unpack_rows(qzeros.T.view(np.uint32), 3)
        return gptq_pack_rows((fields + 1) & 7, 3).T.copy()
    offset = {2: 0b01010101010101010101010101010101, 4: 0x11111111, 8: 0x01010101}[bits]
    return ((qzeros.view(np.uint32).astype(np.int64) + offset) % 2**32).astype(np.uint32).view(np.int32)


def write_gptq(
    model,
    folder: Path,
    bits: int,
    group: int,
    sym: bool,
    act_order: bool,
    v2: bool = False,
    seed: int = 0,
    writer: str = "autogptq",
    zero_every: int = 0,
    meta: bool = True,
) -> dict:
    """GPTQ-quantized Linears (round-to-nearest per group, which is the format GPTQ stores whatever
    the solver), packed as AutoGPTQ packs (``writer="autogptq"``) or as GPTQModel saves v1
    (``"gptqmodel"``: packed as v2, then its v2-to-v1 conversion; ``meta``: its config names it in
    ``meta.quantizer``); with ``act_order`` the groups follow a random permutation of the input
    columns (``g_idx``); ``zero_every`` > 0 sets every such zero point of an asymmetric save to 0.
    Returns name -> the writer's own dequantization ``scales[g_idx] * (q - z[g_idx])`` in float16
    (with the zero points its loader reads back), as float64."""
    rng = np.random.default_rng(seed)
    tensors, expected = {}, {}
    maxq = 2**bits - 1
    for name, linear in _linears(model).items():
        w = linear.weight.detach().numpy().astype(np.float64)  # (out, in)
        out, n_in = w.shape
        order = rng.permutation(n_in) if act_order else np.arange(n_in)
        g_idx = np.empty(n_in, dtype=np.int32)
        g_idx[order] = np.arange(n_in) // group  # columns in activation order fill the groups in turn
        groups = n_in // group
        scales = np.zeros((groups, out), dtype=np.float16)
        zeros = np.zeros((groups, out), dtype=np.int64)
        for g in range(groups):
            cols = w[:, g_idx == g]
            lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
            if sym:
                hi = np.maximum(np.abs(lo), hi)
                lo = -hi
            scale = np.where(hi > lo, (hi - lo) / maxq, 1.0)
            scales[g] = scale.astype(np.float16)
            zeros[g] = (maxq + 1) // 2 if sym else np.rint(-lo / scale)
        if zero_every and not sym:
            zeros.reshape(-1)[::zero_every] = 0
        s = scales.astype(np.float64)[g_idx].T
        q = np.clip(np.rint(w / s + zeros[g_idx].T), 0, maxq).astype(np.int64)  # (out, in)
        tensors[f"{name}.qweight"] = gptq_pack_rows(q.T, bits)
        if v2:
            stored = gptq_pack_rows(zeros.T, bits).T.copy()
            read = zeros
        elif writer == "autogptq":
            stored = autogptq_pack_zeros(zeros, bits)
            read = autogptq_unpack_zeros(stored, bits, act_order)
        else:
            stored = gptqmodel_v2_to_v1(gptq_pack_rows(zeros.T, bits).T.copy(), bits)
            read = gptq_unpack_rows(gptqmodel_v1_to_v2(stored, bits).T.view(np.uint32), bits).T
        tensors[f"{name}.qzeros"] = stored
        tensors[f"{name}.scales"] = scales
        tensors[f"{name}.g_idx"] = g_idx
        expected[f"{name}.weight"] = (s.astype(np.float16) * (q - read[g_idx].T).astype(np.float16)).astype(np.float64)
    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group,
        "desc_act": act_order,
        "sym": sym,
        "checkpoint_format": "gptq_v2" if v2 else "gptq",
    }
    if writer == "gptqmodel" and meta:
        config["meta"] = {"quantizer": ["gptqmodel:7.7.0"], "uri": "https://github.com/modelcloud/gptqmodel"}
    _save(folder, model, tensors, config)
    return expected


# ------------------------------------------------------------------------------------------------ AWQ


def awq_pack_columns(intweight: np.ndarray) -> np.ndarray:
    """AutoAWQ's ``WQLinear_GEMM.from_linear`` packing, transcribed: ``intweight`` (rows, cols) of
    4-bit values, 8 columns a word in the order [0, 2, 4, 6, 1, 3, 5, 7]."""
    intweight = intweight.astype(np.uint32)
    pack_num, order_map = 8, [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = np.zeros((intweight.shape[0], intweight.shape[1] // pack_num), dtype=np.uint32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight[:, col] |= intweight[:, col * pack_num + order_map[i]] << (i * 4)
    return qweight.view(np.int32)


def write_awq(model, folder: Path, group: int) -> dict:
    """AWQ GEMM 4-bit Linears (asymmetric, per group of input rows); returns AutoAWQ's
    ``(q - z) * scales`` in float16, transposed to (out, in), as float64."""
    tensors, expected = {}, {}
    for name, linear in _linears(model).items():
        w = linear.weight.detach().numpy().astype(np.float64).T  # (in, out)
        n_in, out = w.shape
        g = w.reshape(n_in // group, group, out)
        lo, hi = g.min(1), g.max(1)
        scales = ((hi - lo) / 15).astype(np.float16)
        s = scales.astype(np.float64)
        zeros = np.clip(np.rint(-lo / s), 0, 15).astype(np.int64)
        q = np.clip(np.rint(g / s[:, None] + zeros[:, None]), 0, 15).astype(np.int64).reshape(n_in, out)
        tensors[f"{name}.qweight"] = awq_pack_columns(q)
        tensors[f"{name}.qzeros"] = awq_pack_columns(zeros)
        tensors[f"{name}.scales"] = scales
        zr, sr = np.repeat(zeros, group, 0), np.repeat(scales, group, 0)
        expected[f"{name}.weight"] = ((q - zr).astype(np.float16) * sr).astype(np.float64).T
    _save(
        folder,
        model,
        tensors,
        {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True},
    )
    return expected


# ------------------------------------------------------------------------------------------------ MLX


def mlx_pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` (rows, cols) of unsigned ``bits``-bit integers as mlx stores them: each row a
    little-endian bit stream in uint32 words (value k at bits k*bits.., crossing words for 3/5/6)."""
    rows, cols = values.shape
    words = np.zeros((rows, cols * bits // 32), dtype=np.uint64)
    for k in range(cols):
        at = k * bits
        v = values[:, k].astype(np.uint64)
        words[:, at // 32] |= (v << np.uint64(at % 32)) & np.uint64(0xFFFFFFFF)
        if at % 32 + bits > 32:
            words[:, at // 32 + 1] |= v >> np.uint64(32 - at % 32)
    return words.astype(np.uint32)


def write_mlx(model, folder: Path, bits: int, group: int) -> dict:
    """mlx-lm's affine quantization (``w ~ scales * q + biases`` per group, float16 scales and
    biases); returns ``scales * q + biases`` in float16 arithmetic (as mx.dequantize), as float64."""
    tensors, expected = {}, {}
    maxq = 2**bits - 1
    for name, linear in _linears(model).items():
        w = linear.weight.detach().numpy().astype(np.float32)
        out, n_in = w.shape
        g = w.reshape(out, n_in // group, group)
        lo, hi = g.min(-1), g.max(-1)
        scales = ((hi - lo) / maxq).astype(np.float16)
        biases = lo.astype(np.float16)
        q = (
            np.clip(np.rint((g - biases[..., None].astype(np.float32)) / scales[..., None].astype(np.float32)), 0, maxq)
            .astype(np.int64)
            .reshape(out, n_in)
        )
        tensors[f"{name}.weight"] = mlx_pack_rows(q, bits)
        tensors[f"{name}.scales"] = scales
        tensors[f"{name}.biases"] = biases
        sr, br = np.repeat(scales, group, 1), np.repeat(biases, group, 1)
        expected[f"{name}.weight"] = ((sr * q.astype(np.float16)) + br).astype(np.float64)  # float16 arithmetic
    _save(folder, model, tensors, {"group_size": group, "bits": bits}, key="quantization")
    return expected


def write_mlx_native(model, folder: Path, bits: int, group: int) -> dict:
    """The Linears quantized by mlx itself (``mx.quantize`` of the float16 weight); returns
    ``mx.dequantize`` of what it stored, as float64."""
    import mlx.core as mx

    tensors, expected = {}, {}
    for name, linear in _linears(model).items():
        w = mx.array(linear.weight.detach().numpy().astype(np.float16))
        q, scales, biases = mx.quantize(w, group_size=group, bits=bits)
        tensors[f"{name}.weight"] = np.array(q)
        tensors[f"{name}.scales"] = np.array(scales)
        tensors[f"{name}.biases"] = np.array(biases)
        expected[f"{name}.weight"] = np.array(mx.dequantize(q, scales, biases, group_size=group, bits=bits)).astype(
            np.float64
        )
    _save(folder, model, tensors, {"group_size": group, "bits": bits}, key="quantization")
    return expected


def write_finegrained_fp8(model, folder: Path, block) -> dict:
    """transformers' fine-grained FP8 layout (DeepSeek-V3 / Qwen3-FP8): E4M3 ``weight`` and a float32
    ``weight_scale_inv`` per ``block`` (None: per tensor); returns transformers' own dequantization
    (``Fp8Dequantize._dequantize_one`` to float32), as float64."""
    import torch
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    tensors, expected = {}, {}
    for name, linear in _linears(model).items():
        w = linear.weight.detach().float()
        out, n_in = w.shape
        r, c = block or (out, n_in)
        blocks = w.reshape(out // r, r, n_in // c, c)
        scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
        q = (blocks / scale[:, None, :, None]).reshape(out, n_in).to(torch.float8_e4m3fn)
        scale = scale if block else scale.reshape(())
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"] = q, scale
        expected[f"{name}.weight"] = (
            Fp8Dequantize(None)
            ._dequantize_one(q, scale if block else scale.reshape(1, 1), torch.float32)
            .double()
            .numpy()
        )
    _save(
        folder,
        model,
        tensors,
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block) if block else None},
    )
    return expected


# ------------------------------------------------------------------------- the format's error, per value


def group_absmax(w: np.ndarray, strategy: str, group: int | None = None, block=None) -> np.ndarray:
    """Each value's quantization group's largest ``|w|``, broadcast to ``w``'s shape: ``tensor``,
    ``channel`` (a row), ``group`` / ``tensor_group`` (``group`` consecutive values of a row) or
    ``block`` (``block = (rows, cols)`` tiles)."""
    a = np.abs(w)
    out, n_in = w.shape
    if strategy == "tensor":
        return np.full(w.shape, a.max())
    if strategy == "channel":
        return np.repeat(a.max(axis=1, keepdims=True), n_in, axis=1)
    if strategy in ("group", "tensor_group"):
        return np.repeat(a.reshape(out, n_in // group, group).max(axis=2), group, axis=1)
    r, c = block
    tiles = a.reshape(out // r, r, n_in // c, c).max(axis=(1, 3))
    return np.repeat(np.repeat(tiles, r, axis=0), c, axis=1)


# (c, r): |w - dequantized| <= c * (group's max |w|) + r * (|w| + |dequantized|) + 2^-12 * (tensor's max |w|).
#   int / affine with b bits: one full grid step, 2 max|w| / (2^b - 1) (a round-to-nearest quantizer is within half
#     a step; a zero point or bias rounded to the grid, or a scale rounded to bfloat16/float16, can clip the extreme
#     value by up to another half), times 1 + 2^-5 for the scale's rounding; r: the bfloat16 casts (2^-8 each).
#   fp8 (E4M3, scale max|w| / 448): half a spacing is 2^-4 of the value for normal numbers; the scale rounded to
#     bfloat16 can push the largest value past 448 and clip it by 448 * 2^-8 scales (c = 2^-7 >= 1.75 / 448).
#   fp4 (NVFP4, E2M1 with an FP8 scale per 16 values, about max|w| / 6): half a spacing is at most |x| / 4 or 0.25
#     scales (0.25 * max|w| / 6 * (1 + 2^-4) < 0.05 max|w|); a clipped value's error is below |w| / 4.
#   The last term covers scales that fall among FP8's subnormals (NVFP4's per-block scale of a tiny block).
FORMAT_ERROR = {"fp8": (2.0**-7, 2.0**-4 + 2.0**-6), "fp4": (0.05, 0.25 + 2.0**-6)}


def assert_within_format_error(model, dequantized: dict, kind: str, strategy: str, group=None, block=None, bits=8):
    """Every dequantized weight (name -> matrix, from a library's own kernel) lies within its format's
    error of ``model``'s float weights (kind ``int``, ``affine``, ``fp8`` or ``fp4``, see FORMAT_ERROR)."""
    c, r = FORMAT_ERROR.get(kind, (2 / (2**bits - 1) * (1 + 2.0**-5), 2.0**-7))
    for name, linear in _linears(model).items():
        w = linear.weight.detach().numpy().astype(np.float64)
        deq = dequantized[f"{name}.weight"]
        bound = c * group_absmax(w, strategy, group, block) + r * (np.abs(w) + np.abs(deq)) + 2.0**-12 * np.abs(w).max()
        ratio = np.abs(w - deq) / bound
        assert ratio.max() <= 1, f"{name}: |w - dequantized| reaches {ratio.max():.3f} of the {kind} format's error"
