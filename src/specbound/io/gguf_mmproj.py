"""llama.cpp's multimodal projector files (``mmproj-*.gguf``): the vision tower of a vision-language model,
written beside its text GGUF by ``convert_hf_to_gguf.py --mmproj`` (``MmprojModel``; ``general.architecture``
``clip``) or, for LLaVA 1.5, by the older ``convert_image_encoder_to_gguf.py``.

What the file holds and how it is read:

* **Metadata.** ``clip.vision.block_count``, ``embedding_length``, ``feed_forward_length``,
  ``attention.head_count``, ``attention.layer_norm_epsilon``, ``image_size``, ``patch_size``, and the
  projector type (``clip.projector_type``, or ``clip.vision.projector_type`` in a file holding an audio
  encoder too).  Each count must be a positive integer of at most 2^53, the embedding width a multiple of
  the head count, the epsilon a finite positive number, ``block_count`` no more than the blocks the file
  holds tensors of; a missing key or another type is one line naming it.  The feed-forward activation is
  clip.cpp's: ``clip.use_gelu`` GELU (ggml's tanh approximation: ``gelu_pytorch_tanh``), ``clip.use_silu``
  SiLU, neither the quick GELU (CLIP's ``quick_gelu``).
* **The encoder** (:data:`ENCODERS`): the projector type says which vision encoder the converter wrote.
  ``mlp`` (LLaVA 1.5: a CLIP encoder), ``gemma3`` (Gemma 3: SigLIP) and ``idefics3`` (Idefics3 / SmolVLM:
  SigLIP) are a chain of pre-norm blocks, each attention (``v.blk.N.attn_q`` / ``attn_k`` / ``attn_v`` /
  ``attn_out``) then a two-matrix feed-forward (``ffn_up``, ``ffn_down``): the family ``mmproj_gguf``
  (``archs/data/mmproj_gguf.json``), the same chain as the ``clip`` / ``siglip`` families' vision tower,
  reported as ``towers.vision``.  Every other projector type is refused in one line naming the encoder
  specbound lacks (:data:`MISSING`).
* **The feed-forward's names.** The LLaVA converter names ``fc1`` ``ffn_down`` and ``fc2`` ``ffn_up``; clip.cpp
  swaps them back when ``ffn_down``'s input width is the embedding width (for the projector types of
  :data:`SWAPPED_FFN_TYPES`).  The reader does the same, so ``ffn_up`` is always the matrix llama.cpp applies
  first, and the analysis names the swap among its assumptions.
* **The projector** (``mm.*``: LLaVA's two-layer MLP ``mm.0`` / ``mm.2`` and LLaVA-NeXT's
  ``model.image_newline``, Gemma 3's ``mm.input_projection`` and ``mm.soft_emb_norm``, Idefics3's pixel shuffle
  then ``mm.model.fc``) maps the encoder's output into
  the text model's embedding space once, after the last block: outside the chain of blocks the bound is
  over, like a classifier head.  Its tensors are named among the analysis' assumptions, not analysed.
* **Tensors** are read as every GGUF tensor is (:class:`~.gguf_file.GGUFCheckpoint`: F32 / F16 / BF16
  exact, a quantized type dequantized); no rotary permutation (the encoders have no rotary positions).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..errors import SpecboundError
from ..options import MAX_COUNT, MAX_SCALE
from .gguf_file import _EXACT, _INTEGER, _SHARD, GGUFCheckpoint, gguf_facts, is_gguf, open_gguf
from .gguf_header import GGUFHeader, SkippedArray, read_header

ARCH = "clip"  # general.architecture of every mmproj file (gguf's MODEL_ARCH.MMPROJ)
MODEL_TYPE = "gguf-clip"  # the config's model_type: archs/data/mmproj_gguf.json
# projector type -> (the vision encoder the converter wrote, the model it comes from)
ENCODERS = {"mlp": ("CLIP", "LLaVA 1.5"), "gemma3": ("SigLIP", "Gemma 3"), "idefics3": ("SigLIP", "Idefics3 / SmolVLM")}
# projector type -> what specbound lacks to analyse its encoder (the types gguf's VisionProjectorType names)
_ROTARY_2D = "2D rotary positions over the patch grid"
MISSING = {
    "pixtral": f"Pixtral's vision encoder ({_ROTARY_2D}, a gated feed-forward, RMS norms)",
    "lightonocr": f"Pixtral's vision encoder ({_ROTARY_2D})",
    "qwen2vl_merger": f"Qwen2-VL's vision transformer ({_ROTARY_2D}, the patch merger)",
    "qwen2.5vl_merger": f"Qwen2.5-VL's vision transformer ({_ROTARY_2D}, window attention, a gated feed-forward)",
    "qwen3vl_merger": f"Qwen3-VL's vision transformer ({_ROTARY_2D}, deepstack taps)",
    "llama4": f"Llama 4's vision encoder ({_ROTARY_2D}, the pixel-shuffle adapter)",
    "gemma3nv": "Gemma 3n's MobileNet vision encoder (convolutions)",
    "gemma4v": "Gemma 4's vision encoder",
    "kimivl": f"Kimi-VL's MoonViT ({_ROTARY_2D})",
    "kimik25": f"Kimi K2.5's MoonViT ({_ROTARY_2D})",
    "internvl": "InternVL's InternViT (layer scales, its own family)",
    "ldp": "MobileVLM's lightweight downsample projector's CLIP variant",
    "ldpv2": "MobileVLM v2's projector's CLIP variant",
}
_AUDIO = (
    "ultravox",
    "qwen2a",
    "qwen3a",
    "glma",
    "voxtral",
    "meralion",
    "lfm2a",
    "musicflamingo",
    "granite_speech",
    "gemma3na",
    "gemma4a",
)
# clip.cpp's projector types whose feed-forward names may be the legacy converter's swapped ones
SWAPPED_FFN_TYPES = ("mlp", "mlp_norm", "ldp", "ldpv2", "gemma3", "idefics3")
# the counts the vision config is read from (without the ``clip.vision.`` prefix) and its keys
_COUNTS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
}
_OPTIONAL_COUNTS = {"image_size": "image_size", "patch_size": "patch_size", "projection_dim": "projection_dim"}
_EPS = "attention.layer_norm_epsilon"
_BLOCK = re.compile(r"^v\.blk\.(\d{1,9})\.")
_IMAGE_NEWLINE = "model.image_newline"  # LLaVA-NeXT's learned separator after each row of image features
_REENCODE = "the file is corrupt or hand-edited: re-convert it with llama.cpp's convert_hf_to_gguf.py --mmproj"


def is_mmproj(header: GGUFHeader) -> bool:
    """Whether ``header`` is a multimodal projector file's (``general.architecture`` ``clip``)."""
    return header.metadata.get("general.architecture") == ARCH


def open_gguf_file(path: Path, config: dict[str, Any] | None = None):
    """The GGUF format's opener (io/formats.py): llama.cpp's multimodal projector file as its vision tower
    (:func:`open_mmproj`), any other GGUF file as :func:`~.gguf_file.open_gguf` reads it."""
    header = read_header(path)
    if is_mmproj(header):
        return open_mmproj(path, header)
    return open_gguf(path, config, header=header)


def open_mmproj(path: Path, header: GGUFHeader):
    """The vision tower of the mmproj file ``path`` (module docstring) as a
    :class:`~.gguf_file.GGUFCheckpoint` whose config nests it as ``vision_config``."""
    meta = header.metadata
    if meta.get("split.count", 1) != 1:
        raise SpecboundError(
            f"{path}: split.count is {meta['split.count']!r:.40}, expected 1 (an mmproj file is "
            f"read whole); merge the parts with llama-gguf-split --merge"
        )
    projector = _projector_type(path, meta)
    vision = _vision_config(path, header, projector)
    tensors = dict(header.tensors)
    conventions = {"gguf_mmproj_projector": _projector_sentence(projector, tensors)}
    if _swap_ffn_names(tensors, projector, vision["hidden_size"]):
        conventions["gguf_mmproj_ffn_names"] = (
            "the file names each block's first feed-forward matrix (fc1, embedding width in) ffn_down and the "
            "second ffn_up, as LLaVA's converter wrote them; read swapped back by their shapes, as llama.cpp's "
            "clip.cpp does"
        )
    config = {k: v for k, v in meta.items() if not isinstance(v, SkippedArray)}
    config.update(model_type=MODEL_TYPE, vision_config=vision)
    quantized = {n: t.kind for n, t in tensors.items() if t.kind not in _EXACT and t.kind not in _INTEGER}
    if header.big_endian and quantized:
        raise SpecboundError(
            f"{path} is a big-endian mmproj file with quantized tensors; specbound reads a "
            f"big-endian GGUF's float tensors only: convert it back to little-endian"
        )
    return GGUFCheckpoint(
        location=str(path),
        config=config,
        path=path,
        arch=ARCH,
        _headers={path: header},
        _tensors=tensors,
        quantized=quantized,
        _files={n: path for n in tensors},
        facts=gguf_facts(quantized, conventions),
    )


def _projector_type(path: Path, meta: dict[str, Any]) -> str:
    """The projector type, checked: a vision encoder specbound has a family for, or one line naming what is
    missing."""
    if meta.get("clip.has_vision_encoder") is not True:
        audio = meta.get("clip.has_audio_encoder") is True
        flag = meta.get("clip.has_vision_encoder")
        found = "an audio encoder only" if audio else f"clip.has_vision_encoder = {flag!r:.40}"
        raise SpecboundError(
            f"{path}: expected an mmproj file holding a vision encoder (clip.has_vision_encoder "
            f"true), found {found}; specbound analyses vision encoders: pass a vision model's "
            f"mmproj file"
        )
    key = "clip.vision.projector_type" if "clip.vision.projector_type" in meta else "clip.projector_type"
    projector = meta.get(key)
    if not isinstance(projector, str):
        found = "no such key" if projector is None else f"{projector!r} ({type(projector).__name__})"
        raise SpecboundError(
            f"{path}: the mmproj metadata key 'clip.projector_type' must name the projector type "
            f"(a string such as 'mlp' or 'gemma3'), found {found}; {_REENCODE}"
        )
    if projector in ENCODERS:
        return projector
    shown = projector[:60]
    if projector in _AUDIO:
        what = "an audio encoder, which specbound does not analyse"
    elif projector in MISSING:
        what = f"{MISSING[projector]}, which specbound has no family for yet"
    else:
        what = "a vision encoder specbound does not know"
    supported = ", ".join(f"{k} ({e[1]}: {e[0]})" for k, e in ENCODERS.items())
    raise SpecboundError(
        f"{path}: mmproj projector type {shown!r} is not supported: its encoder is {what}; "
        f"supported projector types: {supported}; analyse the model's Hugging Face weights "
        f"(--tower text for its text tower) instead"
    )


def _count(path: Path, meta: dict[str, Any], key: str, required: bool) -> int | None:
    full = f"clip.vision.{key}"
    value = meta.get(full)
    if value is None and not required:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_COUNT):
        found = (
            "no such key"
            if value is None
            else (
                f"an array of {len(value)}"
                if isinstance(value, list)
                else f"{value!r}"[:80] + f" ({type(value).__name__})"
            )
        )
        raise SpecboundError(
            f"{path}: the mmproj metadata key {full!r} must hold a positive integer (at most 2^53), "
            f"found {found}; {_REENCODE}"
        )
    return value


def _flag(path: Path, meta: dict[str, Any], key: str) -> bool:
    value = meta.get(key, False)
    if not isinstance(value, bool):
        raise SpecboundError(
            f"{path}: the mmproj metadata key {key!r} must hold a boolean, found {value!r:.80} "
            f"({type(value).__name__}); {_REENCODE}"
        )
    return value


def _activation(path: Path, meta: dict[str, Any]) -> str:
    """clip.cpp's feed-forward activation: ``use_gelu`` ggml's GELU (tanh approximation), ``use_silu`` SiLU,
    neither the quick GELU."""
    gelu, silu = _flag(path, meta, "clip.use_gelu"), _flag(path, meta, "clip.use_silu")
    if gelu and silu:
        raise SpecboundError(
            f"{path}: the mmproj metadata sets both clip.use_gelu and clip.use_silu; llama.cpp "
            f"refuses such a file: {_REENCODE}"
        )
    return "gelu_pytorch_tanh" if gelu else "silu" if silu else "quick_gelu"


def _vision_config(path: Path, header: GGUFHeader, projector: str) -> dict[str, Any]:
    """The vision tower's config under the Hugging Face keys, every value checked (module docstring)."""
    meta = header.metadata
    vision: dict[str, Any] = {hf: _count(path, meta, key, True) for key, hf in _COUNTS.items()}
    vision.update({hf: v for key, hf in _OPTIONAL_COUNTS.items() if (v := _count(path, meta, key, False))})
    width, heads = vision["hidden_size"], vision["num_attention_heads"]
    if width % heads:
        raise SpecboundError(
            f"{path}: clip.vision.embedding_length {width:,} is not a multiple of "
            f"clip.vision.attention.head_count {heads:,}; {_REENCODE}"
        )
    eps = meta.get(f"clip.vision.{_EPS}")
    if eps is not None:
        if not (
            isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and 0 < eps <= MAX_SCALE
        ):
            raise SpecboundError(
                f"{path}: the mmproj metadata key 'clip.vision.{_EPS}' must hold a finite positive "
                f"number, found {eps!r:.80} ({type(eps).__name__}); {_REENCODE}"
            )
        vision["layer_norm_eps"] = eps
    held = {int(m.group(1)) for name in header.tensors if (m := _BLOCK.match(name))}
    declared = vision["num_hidden_layers"]
    if declared > (max(held) + 1 if held else 0):
        raise SpecboundError(
            f"{path}: clip.vision.block_count declares {declared:,} blocks but the file holds "
            f"tensors of {len(held):,} (v.blk.0 to v.blk.{max(held, default=-1)}); {_REENCODE}"
        )
    vision.update(hidden_act=_activation(path, meta), projector_type=projector, encoder=ENCODERS[projector][0].lower())
    return vision


def _swap_ffn_names(tensors: dict, projector: str, width: int) -> bool:
    """clip.cpp's fix of the legacy names: when ``ffn_down``'s input width is the embedding width, the two
    feed-forward matrices of every block are exchanged (``ffn_up`` is then the one applied first).  True
    when the file's names were swapped."""
    if projector not in SWAPPED_FFN_TYPES:
        return False
    swapped = False
    for name in [n for n in tensors if _BLOCK.match(n) and n.endswith(".ffn_down.weight")]:
        up = name.replace(".ffn_down.", ".ffn_up.")
        if up in tensors and tensors[name].shape[-1] == width:
            for suffix in (".weight", ".bias"):
                a, b = name.replace(".weight", suffix), up.replace(".weight", suffix)
                if a in tensors and b in tensors:
                    tensors[a], tensors[b] = tensors[b], tensors[a]
            swapped = True
    return swapped


def _projector_sentence(projector: str, tensors: dict) -> str:
    names = sorted(n for n in tensors if n.startswith("mm.") or n == _IMAGE_NEWLINE)
    held = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") if names else "none"
    encoder, model = ENCODERS[projector]
    return (
        f"the {model} projector (type {projector}; tensors {held}) maps the {encoder} encoder's output into the "
        f"text model's embeddings once, after the last block: like a classifier head it is outside the chain "
        f"of blocks the bound is over, and is not analysed"
    )


def gguf_pair(source: Any) -> dict[str, Path] | None:
    """A folder holding a text GGUF model and its mmproj file (as llama.cpp's ``-m model.gguf --mmproj
    mmproj.gguf`` takes them, and as GGUF repositories on the hub ship them): ``{"text": the model (its first
    part, split), "vision": the mmproj file}``; None for anything else (a file, a folder with ``config.json``,
    a folder without an mmproj file).  A folder of several text models or several mmproj files (quantizations
    side by side) is one line naming them."""
    if not isinstance(source, (str, Path)) or not Path(source).is_dir() or (Path(source) / "config.json").exists():
        return None
    folder = Path(source)
    files = sorted(p for p in folder.iterdir() if p.suffix == ".gguf" and is_gguf(p))
    files = [p for p in files if (m := _SHARD.match(p.name)) is None or int(m["no"]) == 1]  # a split model: once
    if not files:
        return None
    found: dict[str, list[Path]] = {"text": [], "vision": []}
    for path in files:
        found["vision" if is_mmproj(read_header(path)) else "text"].append(path)
    if not found["vision"]:
        return None  # GGUF text models only: not a pair (a folder is no GGUF source of its own)
    if len(found["text"]) != 1 or len(found["vision"]) > 1:
        listed = "; ".join(f"{k}: {', '.join(p.name for p in v) or 'none'}" for k, v in found.items())
        raise SpecboundError(
            f"{folder} is read as a text GGUF model and its mmproj file, so it must hold one text "
            f"model and one mmproj file; found {listed}; name one file (specbound analyze "
            f"{folder}/FILE.gguf) or make a folder holding the pair to analyse"
        )
    return {"text": found["text"][0], "vision": found["vision"][0]}


def pair_notes(pair: dict[str, Path]) -> dict[str, str]:
    """The note the text model of a :func:`gguf_pair` adds to its reader's notes (one more assumption of its
    analysis): the mmproj file beside it is its vision tower."""
    return {
        "gguf_mmproj_pair": (
            f"the text model of a vision-language pair: the mmproj file {pair['vision'].name} beside it is its vision "
            f"tower, whose projector's output enters this chain as input tokens, outside the bound like the token "
            f"embeddings; each tower is bounded as a chain of its own, and no whole-model number is given"
        )
    }
