"""Writing a tiny ``transformers`` model as llama.cpp's ``convert_hf_to_gguf.py`` would, with the
``gguf`` package's own writer (tests/io/test_gguf.py, tests/io/test_gguf_families.py).

What the converter does and these helpers repeat: tensor names from gguf's own ``TensorNameMap``;
``LlamaModel.permute`` on Q and K for the ``llama``, ``smollm3`` and ``granite`` architectures only (not for
``llama4``: ``Llama4Model`` turns it off); Llama 4's expert banks split and transposed
(:func:`llama4_tensors`); Granite's multipliers as ``GraniteModel`` writes them (``embedding_scale``,
``residual_scale``, ``attention.scale``, ``logit_scale``); 1 added to every Gemma norm weight
(``GemmaModel`` / ``Gemma2Model`` / ``Gemma3Model.modify_tensors``: Gemma's RMSNorm multiplies by
``1 + w``); Gemma's tied ``lm_head`` skipped; the metadata keys each model class writes.
"""

from __future__ import annotations

import math

import numpy as np

# the architectures convert_hf_to_gguf.py writes with LlamaModel.permute on Q and K (LlamaModel and its
# subclasses SmolLM3Model and GraniteModel; Llama4Model turns it off)
PERMUTED = ("llama", "smollm3", "granite")


def permute(weights, n_head, n_head_kv):
    """convert_hf_to_gguf.py, ``LlamaModel.permute`` (applied to q_proj with ``(n_head, n_head)`` and
    to k_proj with ``(n_head, n_head_kv)``)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_converted(path, model, arch: str, *, extra_tensors: dict | None = None):
    """``model`` (a transformers decoder of the LLaMA naming) as a float32 GGUF file of ``arch``.

    Metadata: block count, context, widths, heads, key/value length, RMS epsilon, the rope base (Gemma
    3: the global layers'), a linear rope scaling, Gemma 2's soft-capping, Gemma 2/3's sliding window,
    a vocabulary list.  ``extra_tensors``: GGUF name -> array written as well (``rope_freqs.weight``).
    """
    import gguf

    cfg = model.config
    layers = cfg.num_hidden_layers
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if hasattr(cfg, "rms_norm_eps"):
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    else:  # a LayerNorm (StarCoder2's norm_epsilon, Cohere2's layer_norm_eps)
        writer.add_layer_norm_eps(getattr(cfg, "norm_epsilon", None) or cfg.layer_norm_eps)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch in ("gemma2", "gemma3") or (arch == "starcoder2" and cfg.sliding_window):
        writer.add_sliding_window(cfg.sliding_window)
    if arch == "cohere2":  # Cohere2Model: the logit scale, the window (no pattern), the rotated dimensions
        writer.add_logit_scale(cfg.logit_scale)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_rope_dimension_count(head_dim)
    if arch == "exaone4" and cfg.sliding_window is not None:  # Exaone4Model: the window and a flag per layer
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    if arch == "granite":
        writer.add_embedding_scale(cfg.embedding_multiplier)
        writer.add_residual_scale(cfg.residual_multiplier)
        writer.add_attention_scale(cfg.attention_multiplier)
        writer.add_logit_scale(cfg.logits_scaling)
    writer.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), layers)
    gemma = arch.startswith("gemma")
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and (gemma or arch == "cohere2"):
            continue  # tied to the embeddings
        array = tensor.detach().float().numpy()
        if gemma and name.endswith("norm.weight"):
            array = array + np.float32(1)
        if arch in PERMUTED and name.endswith("q_proj.weight"):
            array = permute(array, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch in PERMUTED and name.endswith("k_proj.weight"):
            array = permute(array, cfg.num_attention_heads, cfg.num_key_value_heads)
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"gguf's tensor map has no name for {name}")
        writer.add_tensor(target, np.ascontiguousarray(array, dtype=np.float32))
    return _finish(writer, path, extra_tensors or {})


def write_gguf(path, arch: str, tensors: dict, meta: dict, vocab_size: int):
    """A float32 GGUF file of ``arch`` holding ``tensors`` (GGUF name -> array) as they are: each ``meta``
    item written by the writer's ``add_<key>`` method, then a vocabulary list of ``vocab_size`` tokens."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        getattr(writer, f"add_{key}")(value)
    writer.add_token_list([f"t{i}" for i in range(vocab_size)])
    return _finish(writer, path, tensors)


def _finish(writer, path, tensors: dict, matrices=np.float32):
    """Add ``tensors`` (GGUF name -> array) as float32 (those of two or more dimensions as ``matrices``: the
    converter's ``--outtype f16`` keeps vectors in float32) and write the file."""
    for name, array in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=matrices if np.ndim(array) > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama4_metadata(config) -> dict:
    """``Llama4Model.set_gguf_parameters`` on a ``Llama4TextConfig``, as ``GGUFWriter.add_*`` keywords: after
    its ``__init__`` swaps ``intermediate_size`` (the experts' width, written as expert_feed_forward_length)
    for ``intermediate_size_mlp`` (the dense layers', feed_forward_length); TextModel's keys (the rope type
    ``default`` and ``llama3`` write no scaling keys: llama3's factors become the ``rope_freqs`` tensor),
    LlamaModel's vocabulary size and rotated dimensions (``head_dim``), the MoE step, and a sliding window 0
    when every layer type is full attention."""
    meta = dict(
        block_count=config.num_hidden_layers,
        context_length=config.max_position_embeddings,
        embedding_length=config.hidden_size,
        feed_forward_length=config.intermediate_size_mlp,
        head_count=config.num_attention_heads,
        head_count_kv=config.num_key_value_heads,
        rope_freq_base=config.rope_parameters["rope_theta"],
        layer_norm_rms_eps=config.rms_norm_eps,
        expert_count=config.num_local_experts,
        expert_used_count=config.num_experts_per_tok,
        key_length=config.head_dim,
        value_length=config.head_dim,
        vocab_size=config.vocab_size,
        rope_dimension_count=config.head_dim,
        interleave_moe_layer_step=config.interleave_moe_layer_step,
        expert_feed_forward_length=config.intermediate_size,
    )
    if getattr(config, "layer_types", None) and all(t == "full_attention" for t in config.layer_types):
        meta["sliding_window"] = 0
    return meta


def llama3_rope_freqs(config) -> np.ndarray | None:
    """``LlamaModel.generate_extra_tensors``: for a ``llama3`` rope type, each rotary pair's divisor (1 at
    short wavelengths, ``factor`` at long ones, smoothed between), with the original context read from the
    config's top level (8192 when absent, as the converter does), else None."""

    rope = config.rope_parameters
    if rope.get("rope_type", "").lower() != "llama3":
        return None
    dim, base = config.head_dim, rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = getattr(config, "original_max_position_embeddings", None) or 8192
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def llama4_tensors(state: dict, config) -> dict:
    """``Llama4Model.modify_tensors`` on a saved ``Llama4ForCausalLM`` state (numpy arrays): a prefix
    ``language_model.`` dropped, each bank ``gate_up_proj`` ``(E, N, 2 d_ff)`` transposed and split into
    ``gate`` (the first half) and ``up``, ``down_proj`` ``(E, d_ff, N)`` transposed, no Q/K permutation, the
    vision tower's tensors skipped; names from gguf's ``TensorNameMap``; ``rope_freqs`` for llama3."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA4, config.num_hidden_layers)
    out = {}

    def put(name, array):
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"gguf's tensor map has no name for {name}")
        out[target] = array

    for name, array in state.items():
        name = name.replace("language_model.", "", 1) if name.startswith("language_model.") else name
        if "multi_modal_projector" in name or "vision_model" in name:
            continue
        if "gate_up_proj" in name:
            half = array.shape[-1] // 2
            swapped = array.swapaxes(-1, -2)
            put(name.replace("gate_up_proj", "gate_proj.weight"), swapped[..., :half, :])
            put(name.replace("gate_up_proj", "up_proj.weight"), swapped[..., half:, :])
            continue
        if name.endswith("down_proj"):
            name, array = name + ".weight", array.swapaxes(-1, -2)
        put(name, array)
    freqs = llama3_rope_freqs(config)
    if freqs is not None:
        out["rope_freqs.weight"] = freqs
    return out


# llama.cpp's multimodal projector files (mmproj-*.gguf): how each converter names a vision encoder's tensors
_LEGACY_CLIP_NAMES = (
    ("vision_model.", "v."),
    ("encoder.layers", "blk"),
    ("embeddings.", ""),
    ("_proj", ""),
    ("self_attn.", "attn_"),
    ("layer_norm", "ln"),
    ("mlp.fc1", "ffn_down"),
    ("mlp.fc2", "ffn_up"),
    ("embedding", "embd"),
    ("pre_layrnorm", "pre_ln"),
)
_MMPROJ_PREFIX = {"gemma3": "vision_tower.", "idefics3": "model."}  # the wrapper's prefix of vision_model.*


def write_mmproj(path, vision, kind: str, projector: dict, *, text_width: int = 16, matrices=np.float32):
    """``vision`` (a transformers ``CLIPVisionModel`` / ``SiglipVisionModel``) as llama.cpp's mmproj file of
    ``kind``, its matrices of type ``matrices`` (``np.float16``: ``--outtype f16``, the usual
    ``mmproj-*-f16.gguf``) and its vectors float32, with ``projector`` (GGUF name -> array: ``mm.*``) as well.

    ``gemma3`` / ``idefics3``: ``MmprojModel.set_gguf_parameters`` and the subclass's (``Gemma3VisionModel``:
    projector type, layer-norm epsilon, ``use_gelu``; ``Idefics3VisionModel``: the same and the pixel-shuffle
    scale factor), tensor names from gguf's ``TensorNameMap`` for ``MODEL_ARCH.MMPROJ`` on the wrapper's names
    (``vision_tower.vision_model.*``, ``model.vision_model.*``), the MAP head skipped.  ``llava``: the legacy
    ``convert_image_encoder_to_gguf.py`` with a LLaVA projector: ``clip.has_llava_projector``, projector type
    ``mlp``, ``use_gelu`` only for ``hidden_act == "gelu"``, its string renaming (``mlp.fc1`` -> ``ffn_down``,
    ``mlp.fc2`` -> ``ffn_up``), the last block dropped (LLaVA reads the penultimate layer's features:
    ``block_count`` is one less) and the post-layernorm with it.
    """
    import gguf

    cfg = vision.config
    layers = cfg.num_hidden_layers - (kind == "llava")
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type("mmproj")
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text_width)
    writer.add_vision_image_size(cfg.image_size)
    writer.add_vision_patch_size(cfg.patch_size)
    writer.add_vision_embedding_length(cfg.hidden_size)
    writer.add_vision_feed_forward_length(cfg.intermediate_size)
    writer.add_vision_block_count(layers)
    writer.add_vision_head_count(cfg.num_attention_heads)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    writer.add_vision_attention_layernorm_eps(cfg.layer_norm_eps)
    tensors = {}
    if kind == "llava":
        writer.add_bool("clip.has_text_encoder", False)
        writer.add_bool("clip.has_llava_projector", True)
        writer.add_clip_projector_type("mlp")
        writer.add_vision_use_gelu(cfg.hidden_act == "gelu")
        for name, tensor in _vision_state(vision):
            if f"layers.{layers}." in name or "post_layernorm" in name or "position_ids" in name:
                continue
            for old, new in _LEGACY_CLIP_NAMES:
                name = name.replace(old, new)
            tensors[name] = tensor.detach().float().numpy()
    else:
        writer.add_clip_projector_type(kind)
        writer.add_vision_use_gelu(True)
        if kind == "idefics3":
            writer.add_vision_projector_scale_factor(2)
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, layers)
        for name, tensor in _vision_state(vision):
            if name.startswith("vision_model.head.") or "position_ids" in name:
                continue
            target = names.get_name(_MMPROJ_PREFIX[kind] + name, try_suffixes=(".weight", ".bias"))
            if target is None:
                raise ValueError(f"gguf's tensor map has no name for {_MMPROJ_PREFIX[kind] + name}")
            tensors[target] = tensor.detach().float().numpy()
    return _finish(writer, path, {**tensors, **projector}, matrices)


def _vision_state(vision):
    """The encoder's tensors under ``vision_model.*``, as the original checkpoints name them (transformers 5's
    ``*VisionModel`` state dict may leave the prefix out)."""
    return [
        ("vision_model." + name.removeprefix("vision_model."), tensor) for name, tensor in vision.state_dict().items()
    ]
