"""llama.cpp's architectures, one row each: what :mod:`.gguf_file` needs to read a GGUF file of that
architecture as the Hugging Face checkpoint it was converted from.

A row (:class:`GGUFArch`) declares the family spec that reads it (``archs/data/<family>.json``, whose
``model_types`` hold ``gguf-<architecture>``), whether ``convert_hf_to_gguf.py`` permuted the rows of Q and
K, llama.cpp's feed-forward activation (the file stores none), the constants llama.cpp's graph fixes, and
the architecture's own translations: its per-layer types, its config keys (with the conventions assumed
where the file leaves a value unstated), its tensor renames and joins.  The reader applies every row by
one loop; the list of supported architectures, the refusal of the others and the docs are read from
:data:`ARCHS`.  Adding an architecture is one row here, its family spec and its test
(tests/io/test_gguf_archs.py checks every row; docs/extending.md has the recipe).

* **The rotary permutation** (``permuted``): ``LlamaModel.permute`` reorders the rows of every head of
  ``q_proj`` and ``k_proj`` for llama.cpp's interleaved rotary layout; the reader puts them back.
* **Architectures of the late-2026 families**: ``smollm3`` (llama.cpp fixes its NoPE step at 4, which the
  family spec's default gives), ``granite`` (its multipliers under ``embedding_scale``, ``residual_scale``,
  ``attention.scale``, ``logit_scale``), ``exaone4`` (``attention.sliding_window_pattern``'s per-layer flags
  become ``layer_types``: :func:`window_layers`) and ``cohere2`` (no pattern stored: llama.cpp's fixed 4, the
  family spec's default), ``gpt-oss`` (expert banks with biases, ``attn_sinks``; the clamped SwiGLU's
  constants, which llama.cpp's graph fixes).
* **Mixtures with dense leading layers**: ``glm4moe`` (its multi-token-prediction blocks, counted in
  ``block_count`` by the converter, exposed as ``mtp.blk.N.*`` and left out: :func:`nextn_blocks`),
  ``ernie4_5-moe``, and ``deepseek2`` (DeepSeek-V3's latent attention: each layer's ``kv_b_proj`` rebuilt
  from the converter's ``attn_k_b`` and ``attn_v_b`` as ``blk.N.attn_kv_b.weight``, :func:`joined_kv_b`;
  the latent sizes under the Hugging Face keys, :func:`deepseek2_keys`; its YaRN as the Hugging Face
  ``rope_scaling``, ``mscale_all_dim`` from ``rope.scaling.yarn_log_multiplier``, :func:`deepseek2_yarn`).
* **Llama 4** (``llama4``, from ``Llama4ForCausalLM`` or the text model of ``Llama4ForConditionalGeneration``):
  Q and K as stored (``Llama4Model`` turns the permutation off), the expert banks (the converter's split of
  ``gate_up_proj``), the shared expert ``ffn_*_shexp``, dense layers between the expert layers
  (``interleave_moe_layer_step``); the constants llama.cpp's graph fixes and the file does not store (NoPE
  step 4, attention chunks of 8192, the query temperature's 8192 and 0.1, the query/key norm unless 128
  experts) under the Hugging Face keys, named among the analysis' assumptions (:func:`llama4_keys`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .gguf_header import TensorInfo

# a tensor of block N: blk.N.*
BLOCK = re.compile(r"blk\.(\d{1,9})\.")


@dataclass(frozen=True)
class GGUFArch:
    """One llama.cpp architecture (``general.architecture``).

    Attributes
    ----------
    name : str
        The architecture; the config's ``model_type`` is ``gguf-<name>``.
    family : str
        The family spec (``archs/data/<family>.json``) whose ``model_types`` hold ``gguf-<name>``.
    permuted : bool
        Whether ``convert_hf_to_gguf.py`` permuted the rows of Q and K (``LlamaModel.permute``); the
        reader puts them back (:func:`~.gguf_file.unpermute_rows`).
    activation : str
        llama.cpp's feed-forward activation for the architecture (the file stores none), as ``hidden_act``.
    fixed : mapping
        Config keys llama.cpp's graph fixes and the file does not store, set unless the file states them.
    experts_family : str or None
        The family spec of a file of this architecture with ``expert_count > 0``, whose ``model_type`` is
        then ``gguf-<name>-moe`` (a ``llama`` file with experts is Mixtral).
    layers : callable or None
        ``layers(config) -> keys``: the per-layer types (``layer_types``), after ``block_count`` is checked.
    keys : callable or None
        ``keys(path, config) -> (keys, conventions)``: config keys of the architecture's own, and (name ->
        sentence) what it assumed where the file leaves a value unstated, the reader's notes (named in the
        analysis' assumptions).  Refuses a file it cannot translate.
    blocks : callable or None
        ``blocks(path, config, tensors, files) -> (tensors, files)``: tensors renamed before the expert banks
        are sliced (GLM's prediction blocks).
    joined : callable or None
        ``joined(path, tensors) -> {name: (first, second)}``: tensors exposed as the join of two stored ones.
    """

    name: str
    family: str
    permuted: bool = False
    activation: str = "silu"
    fixed: Mapping[str, Any] = field(default_factory=dict)
    experts_family: str | None = None
    layers: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    keys: Callable[[Path, dict[str, Any]], tuple[dict[str, Any], dict[str, str]]] | None = None
    blocks: Callable[..., tuple[dict[str, TensorInfo], dict[str, Path]]] | None = None
    joined: Callable[[Path, dict[str, TensorInfo]], dict[str, tuple[str, str]]] | None = None

    def model_type(self, config: dict[str, Any]) -> str:
        """``gguf-<name>``, or ``gguf-<name>-moe`` for a file with experts where :attr:`experts_family` is set."""
        experts = config.get("expert_count")
        if self.experts_family and isinstance(experts, int) and experts > 0:
            return f"gguf-{self.name}-moe"
        return f"gguf-{self.name}"


# Gemma 3 in llama.cpp: every sixth layer global (rope.freq_base, the rope scaling), the others
# sliding-window layers rotating at base 10000 unscaled (rope.freq_base_swa when the file says so)
_GEMMA3_PATTERN, _GEMMA3_LOCAL_BASE = 6, 10000.0


def window_layers(config: dict[str, Any]) -> dict[str, Any]:
    """``layer_types`` from ``attention.sliding_window_pattern``'s per-layer flags (EXAONE 4), when the
    file has them and a window; none otherwise."""
    layers, pattern = config.get("block_count"), config.get("attention.sliding_window_pattern")
    if (
        not isinstance(layers, int)
        or not isinstance(pattern, list)
        or len(pattern) < layers
        or config.get("attention.sliding_window") is None
    ):
        return {}
    return {"layer_types": ["sliding_attention" if bool(f) else "full_attention" for f in pattern[:layers]]}


def gemma3_layers(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's local and global layers in transformers 5's form (``layer_types`` and
    ``rope_parameters`` per layer type), from llama.cpp's convention (:data:`_GEMMA3_PATTERN`)."""
    layers = config.get("block_count")
    pattern = config.get("attention.sliding_window_pattern", _GEMMA3_PATTERN)
    if not isinstance(layers, int) or layers <= 0:
        return {}
    if isinstance(pattern, list):  # one flag per layer, True for a sliding-window layer
        types = ["sliding_attention" if bool(f) else "full_attention" for f in pattern[:layers]]
    elif isinstance(pattern, int) and pattern > 0:
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    else:
        types = []
    glob = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    if "rope_scaling" in config:
        glob.update(config["rope_scaling"])
    local = {"rope_type": "default", "rope_theta": float(config.get("rope.freq_base_swa", _GEMMA3_LOCAL_BASE))}
    return {"layer_types": types, "rope_parameters": {"full_attention": glob, "sliding_attention": local}}


def nextn_blocks(
    path: Path, config: dict[str, Any], tensors: dict[str, TensorInfo], files: dict[str, Path]
) -> tuple[dict[str, TensorInfo], dict[str, Path]]:
    """GLM-4.5's multi-token-prediction blocks: ``Glm4MoeModel`` writes ``block_count`` as the model's
    layers plus ``nextn_predict_layers`` and stores those last blocks (``blk.L.nextn.*`` and a whole
    layer beside them) as ``blk.L.*``; llama.cpp runs them only to draft tokens, not in the model's
    forward chain.  ``layer_count`` is the model's layers; the trailing blocks' tensors are exposed
    as ``mtp.blk.L.*`` (the family spec ignores them).  The query/key norms are optional in llama.cpp's
    glm4moe graph: ``use_qk_norm`` says whether the file holds them."""
    config.setdefault("use_qk_norm", "blk.0.attn_q_norm.weight" in tensors)
    blocks, extra = config.get("block_count"), config.get("nextn_predict_layers", 0)
    if not isinstance(blocks, int):
        return tensors, files
    if extra >= blocks:
        raise SpecboundError(
            f"{path}: the metadata key 'glm4moe.nextn_predict_layers' says {extra:,} of the "
            f"{blocks:,} blocks are multi-token-prediction blocks, leaving no model layer; the "
            f"file is corrupt or hand-edited: re-convert the model"
        )
    config["layer_count"] = layers = blocks - extra
    out, where = {}, {}
    for name, t in tensors.items():
        m = BLOCK.match(name)
        new = f"mtp.{name}" if m and int(m.group(1)) >= layers else name
        out[new], where[new] = (
            (t if new == name else TensorInfo(new, t.kind, t.shape, t.start, t.n_bytes, t.n_elements)),
            files[name],
        )
    return out, where


def deepseek2_keys(path: Path, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """DeepSeek-V2/V3's latent attention sizes under the Hugging Face keys: ``DeepseekV2Model`` writes
    ``attention.key_length_mla`` (``qk_nope_head_dim + qk_rope_head_dim``) and ``value_length_mla``
    (``v_head_dim``), an older converter the same numbers as ``key_length`` and ``value_length`` (which the
    newer one sets to the absorbed sizes ``kv_lora_rank + qk_rope_head_dim`` and ``kv_lora_rank``), and the
    rotated features as ``rope.dimension_count``; its YaRN as the Hugging Face ``rope_scaling``
    (:func:`deepseek2_yarn`, with what it assumed)."""
    mla = "attention.key_length_mla" in config
    d_qk = config.get("attention.key_length_mla" if mla else "attention.key_length")
    d_v = config.get("attention.value_length_mla" if mla else "attention.value_length")
    d_rope = config.get("rope.dimension_count")
    if not all(isinstance(v, int) for v in (d_qk, d_v, d_rope)) or not 0 < d_rope < d_qk:
        raise SpecboundError(
            f"{path}: a deepseek2 file needs the integers deepseek2.attention.key_length_mla (or "
            f"key_length) above deepseek2.rope.dimension_count > 0 and value_length_mla (or "
            f"value_length), found {d_qk!r}, {d_rope!r}, {d_v!r}: re-convert the model"
        )
    keys: dict[str, Any] = {"qk_nope_head_dim": d_qk - d_rope, "qk_rope_head_dim": d_rope, "v_head_dim": d_v}
    rope, conventions = deepseek2_yarn(path, config)
    return {**keys, **rope}, conventions


# the factor DeepseekV2Model multiplies mscale_all_dim by before storing it as rope.scaling.yarn_log_multiplier
_YARN_LOG_MUL = 0.1


def deepseek2_yarn(path: Path, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """A deepseek2 file's YaRN as the ``rope_scaling`` of the Hugging Face config it was converted from.

    The converter writes ``rope.scaling.type`` ``yarn``, ``.factor``, ``.original_context_length``, the
    ``yarn_beta_fast`` / ``yarn_beta_slow`` and ``yarn_attn_factor`` the config states (read by
    :func:`~.gguf_file._rotary_keys` and here), and ``rope.scaling.yarn_log_multiplier`` = ``0.1 mscale_all_dim``
    when the config has ``mscale_all_dim``; ``mscale`` itself is not stored.  The mapping follows the
    Hugging Face model (the file is its conversion): ``mscale_all_dim`` is the shortest decimal whose
    0.1 multiple rounds to the stored float32 (configs state 1.0, 0.707; float32 tells apart decimals of up
    to 7 significant digits), and ``mscale`` is assumed equal
    to it, which llama.cpp's own deepseek2 context assumes too (its YaRN attention factor is then 1).
    Under that assumption llama.cpp's graph computes what the Hugging Face model does: its ``kq_scale``
    ``(1 + 0.1 mscale_all_dim ln factor)^2 / sqrt(d_qk)`` is transformers' softmax scale with YaRN's
    ``mscale^2``, and the rotated features are not rescaled.  A config whose ``mscale`` differed would scale
    the Hugging Face model's cos and sin by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``,
    which the file cannot tell.  Without ``yarn_log_multiplier`` the config had no ``mscale_all_dim``:
    transformers' default attention factor ``1 + 0.1 ln factor`` on cos and sin and no logit scale.
    Returns ``({"rope_scaling": ...}, conventions)``: the keys, and (name -> sentence) the value assumed, for the
    analysis' assumptions (none when nothing was)."""
    scaling = config.get("rope.scaling.type")
    if scaling in (None, "none", ""):
        return {}, {}
    if scaling != "yarn":
        raise SpecboundError(
            f"{path}: a deepseek2 file with rope.scaling.type {scaling!r}: DeepSeek's converter "
            f"writes 'yarn' (or no scaling); another type is not modelled for this architecture: "
            f"re-convert the model or analyse its Hugging Face safetensors weights"
        )
    rope = dict(config["rope_scaling"])
    for key in ("rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_log_multiplier"):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise SpecboundError(
                f"{path}: the metadata key 'deepseek2.{key}' must hold a non-negative number, found "
                f"{value!r}; the file is corrupt or hand-edited: re-convert the model"
            )
    ext = config.get("rope.scaling.yarn_ext_factor")
    if ext not in (None, 1.0):
        raise SpecboundError(
            f"{path}: deepseek2.rope.scaling.yarn_ext_factor = {ext!r}: YaRN's extrapolation mix is "
            f"1 in transformers' model (the only value modelled), found another; analyse the model's "
            f"Hugging Face safetensors weights instead"
        )
    if config.get("rope.scaling.yarn_attn_factor") is not None:
        rope["attention_factor"] = float(config["rope.scaling.yarn_attn_factor"])
    stored = config.get("rope.scaling.yarn_log_multiplier")
    if stored is None:
        return {"rope_scaling": rope}, {}
    m_all = _decimal_of_float32(stored / _YARN_LOG_MUL, lambda m: np.float32(_YARN_LOG_MUL * m) == np.float32(stored))
    rope.update(mscale=m_all, mscale_all_dim=m_all)
    return {"rope_scaling": rope}, {
        "gguf_yarn_mscale": (
            f"the file stores DeepSeek's YaRN logit scale as rope.scaling.yarn_log_multiplier = 0.1 mscale_all_dim "
            f"(read as mscale_all_dim = {m_all:g}) and not mscale, which is assumed equal to it (as llama.cpp's "
            f"deepseek2 graph assumes): the rotary attention factor is then 1 and the logits carry "
            f"(1 + 0.1 mscale_all_dim ln factor)^2, the Hugging Face model's softmax scale"
        )
    }


def _decimal_of_float32(value: float, matches: Any) -> float:
    """The shortest decimal (up to 9 significant digits) near ``value`` for which ``matches`` holds: the
    number a config stated before the converter stored it as float32; ``value`` when none does."""
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if matches(candidate):
            return candidate
    return float(value)


# llama.cpp's llama4 graph: constants the file does not store (llama_hparams and the LLM_ARCH_LLAMA4 case
# of llama-model.cpp), under the Hugging Face keys, with the value each takes there
_LLAMA4_FIXED = {
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
}
# llama.cpp turns the query/key norm off for this expert count (its 17B-128E type, Llama 4 Maverick)
_LLAMA4_NO_QK_NORM_EXPERTS = 128


def llama4_keys(path: Path, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Llama 4's settings that ``Llama4Model`` does not write, as llama.cpp's graph fixes them, under the
    Hugging Face ``Llama4TextConfig`` keys the family spec reads: every fourth layer unrotated
    (``no_rope_layer_interval`` 4), attention in chunks of 8192 tokens on the rotating layers, the unrotated
    layers' query temperature ``1 + 0.1 ln(1 + floor((t + 1) / 8192))`` (``attn_temperature_tuning``,
    ``floor_scale`` 8192, ``attn_scale`` 0.1), the weightless query/key norm unless the file has 128 experts
    (``use_qk_norm``; Maverick's config turns it off).  Llama 4 Scout's and Maverick's configs state the
    same values; a model converted from a config stating others is read as llama.cpp runs it, which the
    analysis names among its assumptions.  The layers holding experts are every
    ``interleave_moe_layer_step``-th (the last of each step), which llama.cpp and the Hugging Face config
    compute alike.  A file with ``attention.sliding_window`` 0 (llama.cpp's MobileLLM variant, no chunks and
    every layer rotated by its own rule) or without experts is refused in one line."""
    experts, step = config.get("expert_count"), config.get("interleave_moe_layer_step")
    if config.get("attention.sliding_window") == 0:
        raise SpecboundError(
            f"{path}: a llama4 file with attention.sliding_window 0 (llama.cpp's MobileLLM variant: "
            f"no attention chunks, its own rotary layers) is not modelled; analyse the model's "
            f"Hugging Face safetensors weights instead"
        )
    if not isinstance(experts, int) or experts < 1 or not isinstance(step, int) or step < 1:
        raise SpecboundError(
            f"{path}: a llama4 file needs the positive integers llama4.expert_count and "
            f"llama4.interleave_moe_layer_step, found {experts!r} and {step!r}: re-convert the model"
        )
    use_qk_norm = experts != _LLAMA4_NO_QK_NORM_EXPERTS
    fixed = _LLAMA4_FIXED
    return {**fixed, "use_qk_norm": use_qk_norm}, {
        "gguf_llama4_constants": (
            f"the file stores none of Llama 4's NoPE step, attention chunk, query temperature or query/key-norm "
            f"switch: llama.cpp's llama4 graph fixes them and so does the reader (the values of Llama 4 Scout's and "
            f"Maverick's configs): every {fixed['no_rope_layer_interval']}th layer unrotated, chunks of "
            f"{fixed['attention_chunk_size']} tokens, attn_temperature_tuning with floor_scale {fixed['floor_scale']} "
            f"and attn_scale {fixed['attn_scale']:g}, the weightless query/key norm "
            f"{'on' if use_qk_norm else 'off'} ({experts} experts; llama.cpp turns it off for "
            f"{_LLAMA4_NO_QK_NORM_EXPERTS})"
        )
    }


_KB = re.compile(r"^blk\.(\d+)\.attn_k_b\.weight$")


def joined_kv_b(path: Path, tensors: dict[str, TensorInfo]) -> dict[str, tuple[str, str]]:
    """deepseek2: ``DeepseekV2Model`` splits each layer's ``kv_b_proj`` ``(H (d_nope + d_v), r)`` into
    ``attn_k_b`` ``(H, r, d_nope)`` (transposed per head) and ``attn_v_b`` ``(H, d_v, r)``; the reader
    exposes their join as ``blk.N.attn_kv_b.weight`` (a file that stores it is read as stored)."""
    joined = {}
    for name in tensors:
        if not (m := _KB.match(name)) or f"blk.{m[1]}.attn_kv_b.weight" in tensors:
            continue
        v_b = f"blk.{m[1]}.attn_v_b.weight"
        k, v = tensors[name].shape, tensors[v_b].shape if v_b in tensors else None
        if v is None or len(k) != 3 or len(v) != 3 or k[0] != v[0] or k[1] != v[2]:
            raise SpecboundError(
                f"{path}: {name!r} {k} and {v_b!r} {v or 'missing'} are not the (heads, rank, "
                f"d_nope) and (heads, d_v, rank) halves of one kv_b_proj; the file is corrupt or "
                f"hand-edited: re-convert the model"
            )
        joined[f"blk.{m[1]}.attn_kv_b.weight"] = (name, v_b)
    return joined


# llama.cpp's GELU (tanh approximation, ggml_gelu: LLM_FFN_GELU); the other architectures' graphs use SiLU
GELU = "gelu_pytorch_tanh"

# In the order the supported architectures are listed.  Qwen2Model, Qwen3Model, the Gemma models and
# Olmo2Model are converted without the permutation (llama.cpp rotates them NeoX-style), as are GPT-J (its own
# rotation is llama.cpp's interleaved one), Falcon, Phi and Qwen; SmolLM3Model and GraniteModel are
# LlamaModels; Llama4Model is one with the permutation turned off, as Llama 4 rotates adjacent pairs itself.
# Mistral, Llama derivatives and most fine-tunes are "llama".
ARCHS: dict[str, GGUFArch] = {
    row.name: row
    for row in (
        GGUFArch("llama", "llama_gguf", permuted=True, experts_family="mixtral_gguf"),
        GGUFArch("qwen2", "llama_gguf"),
        GGUFArch("qwen3", "qwen3_gguf"),
        GGUFArch("gemma", "gemma_gguf", activation=GELU),
        GGUFArch("gemma2", "gemma2_gguf", activation=GELU),
        GGUFArch("gemma3", "gemma3_gguf", activation=GELU, layers=gemma3_layers),
        GGUFArch("olmo2", "olmo2_gguf"),
        GGUFArch("phi2", "phi2_gguf", activation=GELU),
        GGUFArch("phi3", "phi3_gguf"),
        GGUFArch("gptj", "gptj_gguf", activation=GELU),
        GGUFArch("falcon", "falcon_gguf", activation=GELU),
        GGUFArch("bloom", "bloom_gguf", activation=GELU),
        GGUFArch("qwen2moe", "qwen2_moe_gguf"),
        GGUFArch("qwen3moe", "qwen3_moe_gguf"),
        GGUFArch("starcoder2", "starcoder2_gguf", activation=GELU),
        GGUFArch("smollm3", "smollm3_gguf", permuted=True),
        GGUFArch("granite", "granite_gguf", permuted=True),
        GGUFArch("exaone4", "exaone4_gguf", layers=window_layers),
        GGUFArch("cohere2", "cohere2_gguf"),
        # the clamped SwiGLU as llama.cpp's graph computes it (ggml_swiglu_oai's constants, the Hugging Face defaults)
        GGUFArch("gpt-oss", "gpt_oss_gguf", fixed={"swiglu_limit": 7.0, "swiglu_alpha": 1.702}),
        GGUFArch("glm4moe", "glm4_moe_gguf", blocks=nextn_blocks),
        GGUFArch("ernie4_5-moe", "ernie4_5_moe_gguf"),
        GGUFArch("deepseek2", "deepseek_v3_gguf", keys=deepseek2_keys, joined=joined_kv_b),
        GGUFArch("llama4", "llama4_gguf", keys=llama4_keys),
    )
}
