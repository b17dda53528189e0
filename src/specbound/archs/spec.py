"""The architecture spec schema: one family's tensors, roles, layouts and config keys, validated strictly
(the shipped files are ``specbound/archs/data/*.json``, loaded by :mod:`.registry`).

A spec names, for one family, where each weight the bounds need is stored and how (its *role*
and *layout*), which checkpoint tensors are deliberately ignored, and how to read the model's
dimensions from ``config.json``.  A spec is validated strictly when loaded; the registry is keyed
by the config's ``model_type``.  A user with a family we do not ship writes the same kind of file
and passes it with ``--arch-spec FILE`` (see docs/architectures.md).

Roles (row-vector orientation, docs/spec.md section 1): ``q`` (``N x H d_h``), ``k``, ``v``
(``N x H_kv d_h``), or one fused ``qkv``; ``o`` (``H d_h x N``); ``ff_in`` (``N x d_ff``) and
``ff_out`` (``d_ff x N``) for a plain feed-forward, ``ff_gate``, ``ff_up`` and ``ff_out`` for a gated
one.  Layouts: ``linear`` is a PyTorch ``nn.Linear.weight`` stored ``(out, in)``; ``conv1d`` is a
GPT-2 ``Conv1D.weight`` stored ``(in, out)``.  A fused ``qkv`` also says how its output axis is
split: ``concat`` (``[q | k | v]``, GPT-2, Phi-3), ``per_head`` (``[h0: q k v | h1: q k v | ...]``,
GPT-NeoX, BLOOM) or ``per_group`` (per key/value head ``g``: its query heads, then its key, then its
value, ``[g0: q.. k v | g1: q.. k v | ...]``, Falcon; ``per_head`` when ``H_kv = H``, ``concat`` when
``H_kv = 1``).  A fused ``ff_gate_up`` (Phi-3) is ``[gate | up]`` along its output axis.

A mixture of experts (``experts``, docs/theory.md 3f) names its router, its routed experts' feed-forward
tensors (templates with ``${expert}`` as well as ``${layer}``) and optionally a shared expert with its
sigmoid gate; the router and the gate are read and shape-checked, never analysed as matrices of the
chain.  ``refuse`` lists tensors and config values that change the function in a way specbound does not
model, each with the one-line reason it is refused.
``o`` and ``ff_out`` may name an ``output_scale``: a per-layer vector ``lambda`` (LayerScale, DINOv2)
that multiplies the matrix's output features, folded exactly into the matrix the bounds see
(``W diag(lambda)``).  ``position_terms`` declares DeBERTa's disentangled attention (which
content-to-position and position-to-content terms the config switches on).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import regex

from ..errors import SpecboundError
from ..io.base import load_json
from ..io.patterns import PATTERN_TIMEOUT, bounded_search, compile_pattern
from ..options import POSITIVE_INT, Choice
from .model import MROPE_KINDS, PAIRINGS, QK_NORM_SPANS
from .schema import Flag, Keys, NameMap, Strings, Text, declare, declared, document_keys, fail, read_key, read_keys
from .structure import validate_structure

ROLES = ("q", "k", "v", "qkv", "o", "ff_in", "ff_gate", "ff_up", "ff_gate_up", "ff_out")
LAYOUTS = ("linear", "conv1d")
# an expert bank: one tensor holding every expert's matrix along its first axis, each stored (in, out)
# (gpt-oss, Llama 4: ``mlp.experts.gate_up_proj`` of shape (E, N, 2 d_ff)); routed experts only
BANK = "bank"
FUSIONS = ("concat", "per_head", "per_group")
# a fused [gate | up] (concat), or gate and up alternating along the output axis (gpt-oss: interleaved)
FUSED_ROLES = {"qkv": FUSIONS, "ff_gate_up": ("concat", "interleaved")}
BLOCKS = ("sequential", "parallel")
FEED_FORWARDS = {"plain": ("ff_in", "ff_out"), "gated": ("ff_gate", "ff_up", "ff_out")}
ATTENTION_ROLES = ("q", "k", "v", "qkv", "o")
SCALED_ROLES = ("o", "ff_out")  # roles whose output features a LayerScale vector may multiply
CONFIG_FIELDS = ("num_layers", "hidden_size", "num_heads", "ff_size")
OPTIONAL_CONFIG_FIELDS = (
    "num_kv_heads",
    "head_dim",
    "activation",
    "num_experts",
    "experts_per_token",
    "shared_ff_size",
    "num_shared_experts",
    "dense_ff_size",
)
LAYER_PLACEHOLDER = "${layer}"
EXPERT_PLACEHOLDER = "${expert}"
# Depth of a shared-layer (ALBERT) stack beyond which its config is refused: the stored tensors do
# not bound it, and every depth costs a row of every table.
MAX_SHARED_DEPTH = 100_000
# Seconds one ignore pattern may take on one tensor name (io/patterns.py: the one bounded matcher).
IGNORE_TIMEOUT = PATTERN_TIMEOUT


@dataclass(frozen=True)
class TensorRule:
    """Where one role's weight lives: a name template with ``${layer}`` and its storage layout."""

    role: str
    name: str
    layout: str
    fused: str | None = None
    output_scale: str | None = None  # a per-layer (N,) vector multiplying the output features

    def name_for(self, layer: int, prefix: str = "", expert: int | None = None) -> str:
        name = self.name.replace(LAYER_PLACEHOLDER, str(layer))
        return prefix + (name if expert is None else name.replace(EXPERT_PLACEHOLDER, str(expert)))

    def scale_for(self, layer: int, prefix: str = "") -> str | None:
        """The output-scale vector's tensor name at ``layer``, or None."""
        return None if self.output_scale is None else prefix + self.output_scale.replace(LAYER_PLACEHOLDER, str(layer))


@dataclass(frozen=True)
class ExpertsSpec:
    """A mixture-of-experts feed-forward block (docs/theory.md 3f).

    Attributes
    ----------
    router : TensorRule
        The router's ``(E, N)`` weight (``nn.Linear``): read and shape-checked, not a matrix of the chain.
    tensors : dict[str, TensorRule]
        Each routed expert's feed-forward roles, names with ``${layer}`` and ``${expert}``.
    shared : dict[str, TensorRule] or None
        The always-on shared expert's feed-forward roles (Qwen2-MoE), names with ``${layer}``.
    shared_gate : TensorRule or None
        The shared expert's ``(1, N)`` sigmoid gate (``sigmoid(x w) <= 1`` scales its output).
    """

    router: TensorRule
    tensors: dict[str, TensorRule]
    shared: dict[str, TensorRule] | None = None
    shared_gate: TensorRule | None = None
    # the dense layers' feed-forward roles when only some layers hold the experts (Llama 4), and which
    # layers do: {"list": KEY} (indices), {"step": KEY, "step_default": n} (every n-th, the last of each n)
    dense: dict[str, TensorRule] | None = None
    layers: dict[str, Any] | None = None
    # "softmax": the chosen experts' gates sum to at most 1; "sigmoid": each is at most 1 (Llama 4: a
    # sigmoid of each chosen logit), so they sum to at most top_k; or an object {"scoring", "normalised",
    # "normalised_default", "scale"} (DeepSeek, GLM: sigmoid scores renormalised when norm_topk_prob, times
    # routed_scaling_factor)
    gates: Any = "softmax"

    def gate_bounds(self, config: dict[str, Any], top_k: int) -> tuple[float, float, str]:
        """``(gate_max, gate_sum, scoring)`` with the routing frozen (docs/theory.md 3f): a softmax's top-k
        probabilities (renormalised or not) are each at most 1 and sum to at most 1; sigmoid scores are
        each below 1, their sum below ``k`` unless renormalised to 1; a ``scale`` key
        (routed_scaling_factor) multiplies both."""
        gates = {"scoring": self.gates} if isinstance(self.gates, str) else self.gates
        scoring = gates.get("scoring", "softmax")
        normalised = gates.get("normalised", False)
        if isinstance(normalised, str):
            normalised = config.get(normalised)
            normalised = gates.get("normalised_default", False) if normalised is None else bool(normalised)
        scale = 1.0
        key = gates.get("scale")
        if key and config.get(key) is not None:
            scale = config[key]
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
                raise SpecboundError(
                    f"config.json: {key}={scale!r} must be a positive number (it scales every routed expert's output)"
                )
            scale = float(scale)
        total = 1.0 if scoring == "softmax" or normalised else float(top_k)
        return scale, scale * total, scoring


@dataclass(frozen=True)
class Refusal:
    """A tensor (``pattern`` on its name) or a config value (``config`` not among ``allowed``) that
    changes the model's function in a way specbound does not model: analysing it would be silently
    wrong, so it is refused with ``reason``."""

    reason: str
    pattern: regex.Pattern | None = None
    config: str | None = None
    allowed: tuple = ()


LATENT_TENSORS = ("q_a", "q_a_norm", "q_b", "q", "kv_a", "kv_a_norm", "kv_b")
LATENT_CONFIG = ("q_rank", "kv_rank", "d_nope", "d_rope", "d_v")


@dataclass(frozen=True)
class LatentRule:
    """Where a multi-head latent attention family's tensors live (docs/theory.md 3l): name templates with
    ``${layer}`` of ``q_a`` (``q_a_proj``), ``q_a_norm``, ``q_b``, ``q`` (``q_proj``, used when the config's
    ``q_rank`` is null), ``kv_a`` (``kv_a_proj_with_mqa``), ``kv_a_norm``, ``kv_b``; ``config``: the
    config.json keys of ``q_rank``, ``kv_rank``, ``d_nope``, ``d_rope``, ``d_v``; ``eps``: the keys of the
    latent norms' epsilon (none: ``eps_default``, DeepSeek's norms take no config value)."""

    names: dict[str, str]
    config: dict[str, tuple[str, ...]]
    eps: tuple[str, ...] = ()
    eps_default: float = 1e-6

    def name_for(self, which: str, layer: int, prefix: str = "") -> str:
        return prefix + self.names[which].replace(LAYER_PLACEHOLDER, str(layer))


def _latent_rule(raw: Any, origin: str) -> LatentRule | None:
    if raw is None:
        return None
    keys = {"tensors", "config", "eps", "eps_default"}
    if not isinstance(raw, dict) or not {"tensors", "config"} <= set(raw) <= keys:
        raise fail(
            origin,
            f"'latent_attention' must be an object with 'tensors' and 'config' (and optionally "
            f"'eps', 'eps_default'), found {raw!r}",
        )
    names, config = raw["tensors"], raw["config"]
    if (
        not isinstance(names, dict)
        or set(names) != set(LATENT_TENSORS)
        or not all(isinstance(v, str) and LAYER_PLACEHOLDER in v for v in names.values())
    ):
        raise fail(
            origin,
            f"'latent_attention' tensors must name exactly {list(LATENT_TENSORS)}, each with {LAYER_PLACEHOLDER}",
        )
    if not isinstance(config, dict) or set(config) != set(LATENT_CONFIG):
        raise fail(origin, f"'latent_attention' config must map exactly {list(LATENT_CONFIG)} to config.json keys")
    default = raw.get("eps_default", 1e-6)
    if isinstance(default, bool) or not isinstance(default, (int, float)) or not default > 0:
        raise fail(origin, f"'latent_attention' eps_default must be a positive number, found {default!r}")
    return LatentRule(
        dict(names),
        {k: _str_list(config, k, origin) for k in LATENT_CONFIG},
        _str_list(raw, "eps", origin, required=False),
        float(default),
    )


QK_NORM_GAINS = ("weight", "one_plus_weight", "none")  # RMSNorm's gain: w, Gemma's 1 + w, or none (Llama 4's L2 norm)


@dataclass(frozen=True)
class QKNormRule:
    """Where a family's query/key RMSNorm weights live and how they act (docs/theory.md 3d).

    ``q``, ``k``: name templates with ``${layer}`` of the gains (``(d_h,)`` per head or ``(H d_h,)``
    over the projection, as ``span`` says); ``gain``: ``weight`` (``g = w``) or ``one_plus_weight``
    (Gemma: ``g = 1 + w``); ``eps``: the config.json keys of the norm's epsilon, first present wins;
    ``eps_default``: used when none is present (the model class's default).
    """

    q: str | None
    k: str | None
    span: str
    gain: str
    eps: tuple[str, ...]
    eps_default: float | None = None
    # "rotary": only the layers that rotate normalise (Llama 4: its NoPE layers do not)
    layers: str = "all"
    # a boolean config key switching the norm on (Llama 4's use_qk_norm), its value when absent
    when: str | None = None
    when_default: bool = True

    def names_for(self, layer: int, prefix: str = "") -> tuple[str, ...]:
        """The gains' tensor names at ``layer``; none for a norm without gains (``gain: none``)."""
        if self.gain == "none":
            return ()
        return tuple(prefix + t.replace(LAYER_PLACEHOLDER, str(layer)) for t in (self.q, self.k))


@dataclass(frozen=True)
class ArchSpec:
    """One architecture family, loaded from a spec file and validated.

    Each field a document's key fills declares that key (:func:`.schema.declare`: its constraint or reader, its
    default, its line in docs/architectures.md); :func:`_parse_one` reads them all in one loop.
    """

    family: str = declare(
        "the name reported in the output",
        accepted=(Text(empty=False),),
        requirement="a non-empty string",
        required=True,
        documents=("chain", "stacks", "towers", "wrapper"),
    )
    description: str = declare(
        "what the family is (docs/families.md lists it)",
        accepted=(Text(),),
        requirement="a string",
        absent="",
        documents=("chain", "stacks", "towers", "wrapper", "variant"),
    )
    model_types: tuple[str, ...] = declare(
        "config.json `model_type` values this spec serves",
        accepted=(Strings(),),
        requirement="a list of strings",
        required=True,
        documents=("chain", "stacks", "towers", "wrapper"),
    )
    prefixes: tuple[str, ...] = declare(
        "name prefixes tried in order (task models wrap the base model, e.g. `bert.`)",
        accepted=(Strings(or_else=("",)),),
        requirement="a list of strings",
        absent=("",),
    )
    config_keys: dict[str, tuple[str, ...]] = declare(
        "for each dimension, the config.json keys to try in order. Required: `num_layers`, `hidden_size`, "
        "`num_heads`, `ff_size` (`[]`: read `d_ff` from layer 0's `ff_out` weight; absent with "
        "`ff_size_multiplier`); optional: `num_kv_heads` (grouped-query attention), `head_dim` (default "
        "`hidden_size / num_heads`), `activation` (sets `L_phi`), and with `experts` `num_experts`, "
        "`experts_per_token`, `shared_ff_size`, `num_shared_experts`, `dense_ff_size`",
        name="config",
        required=True,
        read=lambda value, doc: _config_keys(value, doc.raw, doc.origin),
    )
    block: str = declare(
        "`sequential`: attention then feed-forward; `parallel`: both on the block's input (GPT-NeoX, GPT-J)",
        accepted=(Choice(BLOCKS),),
        absent="sequential",
    )
    feed_forward: str = declare(
        "`plain`: `act(x W_in) W_out`; `gated`: `(act(x W_gate) * x W_up) W_out`",
        accepted=(Choice(tuple(FEED_FORWARDS)),),
        absent="plain",
    )
    tensors: dict[str, TensorRule] = declare(
        "role -> `{name, layout}` (roles and layouts below); `name` contains `${layer}`",
        required=True,
        read=lambda value, doc: _tensor_rules(value, ROLES, doc.origin, "tensors"),
        documents=("chain", "variant"),
    )
    ignore: tuple[regex.Pattern, ...] = declare(
        "regular expressions (Python `re.search`) for tensors that are not part of the bound",
        read=lambda value, doc: _patterns(doc.raw, doc.origin),
        absent=(),
        documents=("chain", "stacks", "towers", "wrapper", "variant"),
    )
    origin: str
    block_switch: dict[str, Any] | None = declare(
        '`{"config_key", "default", "if_true", "if_false"}`: the block read from a boolean config key '
        "(its value when absent: `default`), each value a `block`",
        default=None,
        read=lambda value, doc: _block_switch(value, doc.origin),
    )
    ff_size_multiplier: int | None = declare(
        "`d_ff` as a multiple of `hidden_size` when no config key holds it (BLOOM's `4 N`)",
        default=None,
        accepted=(None, POSITIVE_INT),
        requirement="a positive integer",
    )
    shared_layers: dict[str, str] | None = declare(
        '`{"groups_key"[, "inner_key"]}`: layers sharing weights (ALBERT), the config keys of the number of '
        "stored groups and of layers per group",
        default=None,
        accepted=(None, Keys(("groups_key",), ("inner_key",))),
        requirement="an object with 'groups_key' (and optionally 'inner_key'), naming config.json keys",
        documents=("chain", "towers", "variant"),
    )
    rotary: str | None = declare(
        '`{"pairing": "half" | "interleaved"}`: rotary position embeddings, the base, rotated dimensions, '
        "context and rope scaling read from config.json (docs/rotary.md); its optional keys in the table below",
        default=None,
        read=lambda value, doc: _rotary(value, doc.origin),
        fills=("rotary_off_when", "rotary_options"),
        documents=("chain", "towers", "variant"),
    )
    position_terms: dict[str, Any] | None = declare(
        'disentangled attention (DeBERTa): `{"config_key": "pos_att_type", "enabled_by": '
        '"relative_attention", "requires": {key: value}}`; the config\'s `c2p`/`p2c` terms enter `Lambda` and '
        "`gamma*` (docs/theory.md 3h); a config whose `requires` keys lack their value is refused",
        default=None,
        read=lambda value, doc: _position_terms(value, doc.origin),
        documents=("chain", "towers", "variant"),
    )
    # (config conditions, any of which selects the spec, the spec)
    variants: tuple[tuple[tuple[dict[str, Any], ...], "ArchSpec"], ...] = declare(
        '`[{"when": {config key: value or [values]}, ...overrides}]` (`when` may also be a list of such '
        "objects, any one of which selects the variant): the first whose condition config.json meets replaces "
        "the keys it names (objects merged key by key, `null` removes a key), validated as a spec of its own; "
        "DINOv2's SwiGLU (`use_swiglu_ffn`), T5 v1.1's gated feed-forward (`is_gated_act`, or for configs "
        "without it `feed_forward_proj`)",
        default=(),
        documents=("chain", "stacks", "towers"),
    )
    stacks: "tuple[StackSpec, ...] | None" = declare(
        "an encoder-decoder's `encoder` and `decoder`, each with its own `config` and `tensors` (below)",
        default=None,
        documents=("stacks", "variant"),
    )
    towers: "tuple[TowerSpec, ...] | None" = declare(
        "a two-tower model's towers, `text` and `vision`, each a chain of its own or the name of a shipped "
        "family (below)",
        default=None,
        documents=("towers", "wrapper", "variant"),
    )
    tower: str | None = None  # the tower this spec reads (one tower of a two-tower family)
    config_defaults: dict[str, Any] | None = None  # config values the library assumes when a key is absent
    projector: dict[str, Any] | None = declare(
        'a vision-language wrapper\'s `{"prefixes", "description"}`: the tensors mapping the vision tower\'s '
        "output into the text tower's input, outside both towers' bounds, named in each tower's "
        "`vision_language_tower` assumption (below)",
        default=None,
        documents=("towers", "wrapper", "variant"),
    )
    rotary_off_when: str | None = None  # a boolean config key that, when true, replaces rotary by ALiBi (Falcon)
    alibi: bool | str = declare(
        "ALiBi logit biases: always (`true`) or when this boolean config key is true",
        default=False,
        accepted=(Flag(), Text()),
        requirement="true, false or a boolean config.json key",
    )
    activation: str | None = declare(
        "the family's activation when config.json names none (BLOOM's GELU)",
        default=None,
        accepted=(None, Text()),
        requirement="an activation name (as config.json's hidden_act)",
    )
    experts: ExpertsSpec | None = declare(
        "a mixture of experts (docs/theory.md 3f): `router` and `tensors` (each expert's roles, names with "
        '`${expert}` as well as `${layer}`, or one `"layout": "bank"` tensor of every expert; config fields '
        '`num_experts`, `experts_per_token`), optionally `shared` (`{"tensors", "gate"}`: an always-on shared '
        "expert of width `shared_ff_size`, times `num_shared_experts` when that field is mapped, none when it is "
        "0), `dense` (`tensors` of the dense gated block of the layers without experts, of width `dense_ff_size`, "
        'and `layers`: `{"list": KEY}` of the expert layers\' indices, with `step`, `step_default` for configs '
        "without it; or config keys `first`, `last`, `interval` and a `phase` 0 or 1, layer `l` holding experts "
        "when `first <= l <= last` and `(l + phase) % interval == 0`: GLM-4.5's `first_k_dense_replace`, ERNIE "
        "4.5's start, end and interval; or `types`, a key listing each layer's type, with `expert_type`), and "
        "`gates` (`softmax`: the chosen gates sum to at most 1; `sigmoid`: each at most 1, so at most `top_k` "
        'together, Llama 4; or `{"scoring", "normalised", "normalised_default", "scale"}`: `normalised` a '
        "boolean or a config key, `scale` the config key of a factor multiplying every routed gate, "
        "`routed_scaling_factor`), from which the gate bounds `g_max`, `g_sum` follow (docs/theory.md 3n)",
        default=None,
        read=lambda value, doc: _experts(value, doc.values["feed_forward"], doc.values["config_keys"], doc.origin),
    )
    refuse: tuple[Refusal, ...] = declare(
        '`[{"tensor": pattern, "reason"} or {"config": key, "allowed": [values], "reason"}]`: tensors '
        "and config values that change the function in a way specbound does not model, each refused with its "
        "reason",
        default=(),
        read=lambda value, doc: _refusals(value, doc.origin),
    )
    # the rotary object's other keys: rope_type_aliases, legacy_layer_types (docs/architectures.md)
    rotary_options: dict[str, Any] = field(default_factory=dict)
    qk_norm: QKNormRule | None = declare(
        '`{"q": NAME, "k": NAME, "span": "head" | "all_heads", "gain": "weight" | '
        '"one_plus_weight", "eps": [config keys], "eps_default": number}`: an RMSNorm on the queries and '
        "keys before the rotation; each QK row is then the head's stacked factors `[W_Q^h; W_K^g]`, and the "
        "norm's gains and `eps` set its sensitivity and Lipschitz factor (docs/theory.md 3d). `span`: over each "
        "head's `d_h` features (gain tensor `(d_h,)`) or over the whole projection (`(H d_h,)` and "
        '`(H_kv d_h,)`); `gain: "none"` for a weightless norm (no `q`, `k`: Llama 4\'s L2 norm), optionally '
        '`layers: "rotary"` (only the layers that rotate normalise) and `when` / `when_default` (a boolean '
        "config key switching the norm on, Llama 4's `use_qk_norm`)",
        default=None,
        read=lambda value, doc: _qk_norm_rule(value, doc.origin),
    )
    structure: dict[str, str] | None = declare(
        "what the family does beyond its matrices, named in `assumptions` (docs/theory.md 3e; `archs/structure.py`"
        "): config keys `attention_softcap`, `final_softcap`, `sliding_window`, `attention_scalar`, "
        "`residual_multiplier` and `attention_multiplier` (Granite: folded into OV and FF_out, and `m sqrt(d_h)` "
        "into the queries), `embedding_multiplier`, `logit_divisor`, `logit_scale` (the head's logits divided or "
        "multiplied), `swiglu_limit`, `swiglu_alpha` (gpt-oss's clamped SwiGLU), `attention_chunk` (Llama 4's "
        "chunked attention) (the entry applies when the key holds a positive number), `attention_sinks: "
        '"learned"` (gpt-oss), `temperature_tuning: "llama4"` (the NoPE layers\' query temperature, its '
        'largest value folded into their queries), and the facts `embedding_scale: "sqrt_hidden"`, `norm_gain: '
        '"one_plus_weight"`, `sublayer_norms: "after" | "before_and_after"`, `position_bias: "relative"` '
        '(MPNet, T5), `layer_scale: "folded"` (DINOv2), `front_end: "convolutional"` (wav2vec2, HuBERT, '
        'Whisper), `projector: "patch_merger" | "deepstack" | "pixel_shuffle"` (a vision tower\'s projector '
        "after its chain, named in `projector_outside`: Qwen-VL's merger, Qwen3-VL's deepstack taps, Llama 4's "
        "adapter)",
        default=None,
        read=lambda value, doc: _structure(value, doc.origin),
    )
    # the family's own names for activations (T5's feed_forward_proj "gated-gelu" is HF's gelu_new)
    activation_names: dict[str, str] | None = declare(
        "the family's own names for activations, mapped to Hugging Face's (T5's `feed_forward_proj` "
        "`gated-gelu` is `gelu_new`)",
        default=None,
        accepted=(None, NameMap()),
        requirement="an object mapping the family's activation names to HF's",
    )
    latent: LatentRule | None = declare(
        "multi-head latent attention (docs/theory.md 3l): `tensors` names `q_a`, `q_a_norm`, `q_b`, `q` (used "
        "when the query latent's rank is null), `kv_a`, `kv_a_norm`, `kv_b` (templates with `${layer}`, all "
        "`linear`); `config` maps `q_rank`, `kv_rank`, `d_nope`, `d_rope`, `d_v` to config.json keys; `eps` "
        "(config keys) or `eps_default` the latent norms' epsilon. `tensors` then names only `o` (and the "
        "feed-forward roles); the rope settings are read for the rotary key's `d_rope` features, YaRN's "
        "`mscale_all_dim` gives the logit scale",
        name="latent_attention",
        default=None,
        read=lambda value, doc: _latent_rule(value, doc.origin),
    )

    def tower_spec(self, name: str) -> "TowerSpec":
        return next(t for t in self.towers if t.name == name)

    def stack(self, name: str) -> "StackSpec":
        return next(s for s in self.stacks if s.name == name)

    def for_config(self, config: dict[str, Any]) -> "ArchSpec":
        """The spec of the first ``variants`` entry one of whose conditions ``config`` meets (T5 v1.1's
        gated feed-forward, DINOv2's SwiGLU), else this one.  A condition maps config keys to a value or
        a list of accepted values; an absent key has the value None."""
        for conditions, variant in self.variants:
            if any(
                all(config.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())
                for when in conditions
            ):
                return variant.for_config(config)
        rule = self.qk_norm
        if rule is not None and rule.when is not None and not config.get(rule.when, rule.when_default):
            return replace(self, qk_norm=None)  # the config switches the query/key norm off (Llama 4 Maverick)
        return self

    def stored_layers(self, config: dict[str, Any], num_layers: int) -> list[int]:
        """Stored layer index used at each depth: ``0..L-1``, or with ``shared_layers`` (ALBERT)
        ``G`` stored groups, depth ``l`` using group ``floor(l G / L)``."""
        if not self.shared_layers:
            return list(range(num_layers))
        if num_layers > MAX_SHARED_DEPTH:  # a shared-layer stack is not bounded by its stored tensors
            raise SpecboundError(
                f"config.json declares {num_layers} layers sharing weights; specbound "
                f"analyses at most {MAX_SHARED_DEPTH:,}: fix num_hidden_layers"
            )
        groups = config.get(self.shared_layers["groups_key"], 1)
        inner = config.get(self.shared_layers.get("inner_key", ""), 1)
        if not isinstance(groups, int) or not 1 <= groups <= num_layers or num_layers % groups:
            raise SpecboundError(
                f"config.json: {self.shared_layers['groups_key']}={groups!r} must be a positive "
                f"divisor of the {num_layers} layers"
            )
        if inner != 1:
            raise SpecboundError(
                f"config.json: {self.shared_layers.get('inner_key')}={inner!r}: only one layer "
                f"per shared group is supported (every released ALBERT has 1)"
            )
        return [l * groups // num_layers for l in range(num_layers)]

    def block_for(self, config: dict[str, Any]) -> str:
        """``sequential`` or ``parallel``; a ``block_switch`` reads it from a boolean config key."""
        if not self.block_switch:
            return self.block
        flag = config.get(self.block_switch["config_key"], self.block_switch["default"])
        return self.block_switch["if_true"] if flag else self.block_switch["if_false"]

    def rotary_for(self, config: dict[str, Any]) -> str | None:
        """The rotary pairing, or None when the family has no rotary positions or config.json
        switches them off (``rotary_off_when``)."""
        if self.rotary is None or (self.rotary_off_when and config.get(self.rotary_off_when)):
            return None
        return self.rotary

    def alibi_for(self, config: dict[str, Any]) -> bool:
        """Whether attention logits carry ALiBi biases."""
        return bool(config.get(self.alibi)) if isinstance(self.alibi, str) else bool(self.alibi)

    def refused(self, config: dict[str, Any], names: list[str], prefix: str = "") -> None:
        """Raise for the first tensor or config value the spec refuses (module docstring)."""
        for rule in self.refuse:
            if rule.config is not None:
                value = config.get(rule.config)
                if value not in rule.allowed:
                    raise SpecboundError(f"config.json has {rule.config}={value!r}: {rule.reason}")
                continue
            hit = next(
                (
                    n
                    for n in names
                    if _search(rule.pattern, n[len(prefix) :] if prefix and n.startswith(prefix) else n, self.origin)
                ),
                None,
            )
            if hit is not None:
                raise SpecboundError(
                    f"tensor {hit!r} (the {self.family} spec refuses {rule.pattern.pattern!r}): {rule.reason}"
                )

    def is_ignored(self, name: str, prefix: str = "") -> bool:
        """Whether ``name`` matches an ignore pattern, as stored or with the model's ``prefix``
        removed (``^pooler\\.`` must also match ``bert.pooler.dense.weight``), or with only a
        wrapper's part of it removed (``^classifier\\.`` matches ``m.classifier.weight`` under the
        prefix ``m.bert.``)."""
        names = [name]
        for strip in (prefix, self.wrapper_of(prefix)):
            if strip and name.startswith(strip):
                names.append(name[len(strip) :])
        return any(_search(p, n, self.origin) for p in self.ignore for n in names)

    def wrapper_of(self, prefix: str) -> str:
        """The part of a detected ``prefix`` before the longest of the spec's own prefixes that ends
        it (``"m."`` for ``"m.bert."``); ``""`` when ``prefix`` is one of the spec's prefixes."""
        own = max((p for p in self.prefixes if prefix.endswith(p)), key=len, default="")
        return prefix[: len(prefix) - len(own)]

    def config_value(self, config: dict[str, Any], field: str) -> Any:
        """The first of the field's config keys present in ``config``, else the first with a
        ``config_defaults`` value (a tower's sub-config may leave out what its library defaults), or None."""
        for key in self.config_keys.get(field, ()):
            if key in config and config[key] is not None:
                return config[key]
        for key in self.config_keys.get(field, ()):
            if key in (self.config_defaults or {}):
                return self.config_defaults[key]
        return None


@dataclass(frozen=True)
class StackSpec:
    """One stack of an encoder-decoder spec.

    Attributes
    ----------
    name : {"encoder", "decoder"}
    spec : ArchSpec
        The stack's layers as a chain of their own: the spec document with the stack's ``config``
        merged over the shared one and the stack's self-attention and feed-forward tensors.
    cross : dict[str, TensorRule]
        The decoder's cross-attention weights by role (``q``, ``k``, ``v``, ``o``; from the document's
        ``q_cross`` ... ``o_cross``); empty for the encoder.
    """

    name: str
    spec: ArchSpec
    cross: dict[str, TensorRule]


@dataclass(frozen=True)
class TowerSpec:
    """One tower of a two-tower spec (CLIP, SigLIP) or of a vision-language wrapper (Gemma 3, LLaVA): its
    name, the chain it is (a spec of its own, ``tower`` set), and the config.json sections holding its
    config (the first present is read).

    A wrapper's tower *references* a shipped family by name (``family``: ``gemma3_text``, or ``siglip.vision``
    for one tower of a two-tower family) instead of naming tensors: ``spec`` is then None and
    :func:`.towers.tower_spec` resolves the family for one checkpoint (its section's ``model_type`` picks another
    shipped family, LLaVA's Mistral text model), read under the wrapper's ``prefixes`` with the family's
    ignore list and the wrapper's (``ignore``: the other towers', the projector's and the wrapper's own)."""

    name: str
    spec: ArchSpec | None
    config_sections: tuple[str, ...]
    family: str | None = None  # a reference: the family this tower is, resolved by towers.tower_spec
    prefixes: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()  # a reference: section model types that name ``family`` itself
    defaults: dict[str, Any] = field(default_factory=dict)  # a reference: config values the library assumes
    ignore: tuple[regex.Pattern, ...] = ()
    origin: str = ""

    def config_of(self, config: dict[str, Any]) -> dict[str, Any]:
        """The tower's config section of a two-tower config.json, as stored (:func:`.towers.tower_config`
        puts a reference's ``defaults`` under it)."""
        for key in self.config_sections:
            if isinstance(config.get(key), dict):
                return config[key]
        family = self.spec.family if self.spec is not None else self.family
        raise SpecboundError(
            f"config.json has none of {list(self.config_sections)} (the {self.name} tower's config) "
            f"as an object; a {family} checkpoint's config.json needs it"
        )


def as_tower(spec: ArchSpec, tower: TowerSpec) -> ArchSpec:
    """``spec`` (a one-chain family) read as ``tower`` of a wrapper: the wrapper's prefixes, the family's
    ignore list and the tower's, every variant alike."""
    if spec.towers is not None or spec.stacks is not None:
        raise SpecboundError(
            f"{tower.origin}: the {tower.name} tower names the {spec.family} family, which is not "
            f"one chain (it has {'towers' if spec.towers else 'stacks'}); a tower must be one chain"
        )
    return replace(
        spec,
        prefixes=tower.prefixes,
        ignore=spec.ignore + tower.ignore,
        model_types=(),
        tower=tower.name,
        origin=f"{spec.origin} (the {tower.name} tower of {tower.origin})",
        variants=tuple((when, as_tower(v, tower)) for when, v in spec.variants),
    )


TOWER_NAMES = ("text", "vision")
_CHAIN_KEY = "as for one chain"
_CONFIG_SECTION = "the config.json key(s) holding the tower's config (the first present is read)"
# the keys of a two-tower family's tower object (a chain of its own), each with its line in docs/architectures.md
TOWER_KEYS = {
    "config_section": _CONFIG_SECTION,
    "model_types": "the model types of a checkpoint holding this tower alone (CLIPTextModel: `clip_text_model`, "
    "config at the top)",
    "prefixes": _CHAIN_KEY,
    "config": _CHAIN_KEY,
    "tensors": _CHAIN_KEY,
    "feed_forward": _CHAIN_KEY,
    "ignore": f"{_CHAIN_KEY}; a tower's ignore list also gets the shared one and the other towers' prefixes",
    "defaults": "config values the library assumes when a (sub-)config leaves a key out (its config class "
    "defaults; a test holds them to transformers')",
}
# the keys of a vision-language wrapper's tower object (a reference to a shipped family, :class:`TowerSpec`)
REFERENCE_KEYS = {
    "family": "the shipped family the tower is (`FAMILY.TOWER`: one tower of a two-tower family, `siglip.vision`); "
    "its tensors, config vocabulary (every number checked as for that family saved alone), rotary, norms "
    "and ignore list are that family's",
    "config_section": _CONFIG_SECTION,
    "prefixes": "where the tower's layers sit in the wrapper (transformers 5's in-memory names and the saved / older "
    "hub names); they replace the family's own prefixes, the first that holds the family's layer-0 "
    "query weight is used (so a wrapper lists its tower's module path with and without the family's own "
    "inner prefix, `vision_model.model.` and `vision_model.`)",
    "model_types": "model types of the tower's config section that mean the named family (Idefics3's vision "
    "section says `idefics3_vision`: SigLIP's encoder)",
    "defaults": "config values the wrapper's library assumes when the section leaves a key out, applied only to a "
    "section of the named family's own config class (its first model type, absent, or in the tower's "
    "`model_types`): LLaVA 1.5's `text_config` holds little more than `model_type: llama`, Gemma 3's "
    "leaves the head counts out; a test holds them to transformers'",
    "ignore": "patterns added to the family's ignore list for this tower",
}


def _sections(tower: dict, where: str) -> tuple[str, ...]:
    sections = tower["config_section"]
    sections = [sections] if isinstance(sections, str) else sections
    if not isinstance(sections, list) or not sections or not all(isinstance(x, str) for x in sections):
        raise fail(where, "'config_section' must name the config.json key(s) of the tower's config")
    return tuple(sections)


def _projector(raw: Any, origin: str) -> dict[str, Any] | None:
    """The wrapper's ``projector``: ``{"prefixes": [...], "description": text}``, the tensors that map the vision
    tower's output into the text tower's input (outside both towers' bounds, named among the assumptions)."""
    if raw is None:
        return None
    if (
        not isinstance(raw, dict)
        or set(raw) != {"prefixes", "description"}
        or not isinstance(raw["description"], str)
        or not raw["description"]
    ):
        raise fail(
            origin,
            f"'projector' must be an object with 'prefixes' (its tensors' name prefixes) and "
            f"'description' (what it computes), found {raw!r}",
        )
    return {"prefixes": _str_list(raw, "prefixes", origin), "description": raw["description"]}


def _outside(other: str, own: tuple[str, ...]) -> str:
    r"""The ignore pattern of another tower's prefix ``other`` in a tower whose prefixes are ``own``: ``^other``,
    except where one of ``own`` continues it (Qwen2.5-VL's text under ``model.``, its vision under
    ``model.visual.``: the vision tower ignores ``^model\.(?!visual\.)``)."""
    inside = [p[len(other) :] for p in own if p.startswith(other) and p != other]
    return f"^{regex.escape(other)}" + "".join(f"(?!{regex.escape(rest)})" for rest in inside)


def _parse_towered(raw: dict, origin: str) -> ArchSpec:
    """A two-tower spec: ``"towers": {"text": {...}, "vision": {...}}``, each tower a chain spec of its own
    (``config_section``: the config.json key(s) of its config; ``model_types``: the types of a checkpoint
    holding that tower alone; ``defaults``: config values its library assumes when absent), or a reference to
    a shipped family (``family``: a vision-language wrapper, :class:`TowerSpec`).  A tower's ignore list gains
    the shared one, every other tower's prefixes and the ``projector``'s."""
    towers_raw = raw["towers"]
    if not isinstance(towers_raw, dict) or not towers_raw or not set(towers_raw) <= set(TOWER_NAMES):
        raise fail(origin, f"'towers' must be an object whose keys are some of {list(TOWER_NAMES)}")
    if "tensors" in raw or "stacks" in raw:
        raise fail(origin, "a spec with 'towers' names its tensors in each tower (and has no 'stacks')")
    referenced = [isinstance(t, dict) and "family" in t for t in towers_raw.values()]
    if any(referenced) and not all(referenced):
        raise fail(origin, "either every tower names a 'family' (a vision-language wrapper) or none does")
    wrapper_keys = document_keys(ArchSpec, "wrapper")
    if any(referenced) and set(raw) - wrapper_keys:
        raise fail(
            origin,
            f"a wrapper whose towers name their families has only the keys {sorted(wrapper_keys)}; "
            f"found {sorted(set(raw) - wrapper_keys)} (the families' own files say the rest)",
        )
    projector = _projector(raw.get("projector"), origin)
    base = {k: v for k, v in raw.items() if k not in ("towers", "model_types", "ignore", "projector")}
    prefixes = {}
    for name, tower in towers_raw.items():
        required = (
            {"family", "config_section", "prefixes"}
            if any(referenced)
            else {"config_section", "prefixes", "config", "tensors"}
        )
        allowed = set(REFERENCE_KEYS if any(referenced) else TOWER_KEYS)
        if not isinstance(tower, dict) or not required <= set(tower) or not set(tower) <= allowed:
            raise fail(
                origin,
                f"tower {name!r} must be an object with {sorted(required)} (and optionally "
                f"{sorted(allowed - required)})",
            )
        prefixes[name] = _str_list(tower, "prefixes", origin)
    outside = [p for p in (projector or {}).get("prefixes", ()) if p]
    shared = _str_list(raw, "ignore", origin, required=False)
    towers = []
    for name, tower in towers_raw.items():
        where = f"{origin} (tower {name})"
        others = [p for other, ps in prefixes.items() if other != name for p in ps if p] + outside
        ignore = [
            *_str_list(tower, "ignore", where, required=False),
            *shared,
            *(_outside(p, prefixes[name]) for p in others),
        ]
        sections = _sections(tower, where)
        defaults = tower.get("defaults", {})
        if not isinstance(defaults, dict):
            raise fail(where, "'defaults' must map config.json keys to the values the library assumes")
        if "family" in tower:
            if not isinstance(tower["family"], str) or not regex.fullmatch(r"\w+(\.\w+)?", tower["family"]):
                raise fail(where, f"'family' must name a shipped family (or FAMILY.TOWER), found {tower['family']!r}")
            towers.append(
                TowerSpec(
                    name,
                    None,
                    sections,
                    family=tower["family"],
                    prefixes=prefixes[name],
                    model_types=_str_list(tower, "model_types", where, required=False),
                    defaults=dict(defaults),
                    origin=origin,
                    ignore=tuple(_compile(p, where, "ignore") for p in ignore),
                )
            )
            continue
        doc = {
            **base,
            **{k: v for k, v in tower.items() if k not in ("config_section", "defaults")},
            "model_types": tower.get("model_types", []),
            "ignore": ignore,
        }
        spec = replace(parse_spec(doc, where), tower=name, config_defaults=dict(defaults))
        towers.append(TowerSpec(name, spec, sections))
    common = dict(
        model_types=read_key(ArchSpec, raw, "model_types", origin),
        towers=tuple(towers),
        tower=None,
        config_defaults=None,
        variants=(),
        origin=origin,
        projector=projector,
        ignore=tuple(_compile(p, origin, "ignore") for p in shared),
    )
    if towers[0].spec is not None:
        return replace(towers[0].spec, tensors={}, **common)
    return ArchSpec(
        family=read_key(ArchSpec, raw, "family", origin),
        description=read_key(ArchSpec, raw, "description", origin),
        prefixes=("",),
        config_keys={},
        block="sequential",
        feed_forward="plain",
        tensors={},
        **common,
    )


STACK_NAMES = ("encoder", "decoder")
CROSS_ROLES = {"q_cross": "q", "k_cross": "k", "v_cross": "v", "o_cross": "o"}


def _parse_stacked(raw: dict, origin: str) -> ArchSpec:
    """An encoder-decoder spec: ``"stacks": {"encoder": {"config", "tensors"}, "decoder": {...}}``
    (docs/architectures.md).  Each stack is validated as a spec of its own; the decoder's tensors
    also name its cross-attention as ``q_cross``, ``k_cross``, ``v_cross``, ``o_cross``."""
    stacks_raw = raw["stacks"]
    if not isinstance(stacks_raw, dict) or list(stacks_raw) != list(STACK_NAMES):
        raise fail(origin, f"'stacks' must be an object with the keys {list(STACK_NAMES)}, in that order")
    if "tensors" in raw:
        raise fail(origin, "a spec with 'stacks' names its tensors in each stack, not at the top")
    if not isinstance(raw.get("config", {}), dict):
        raise fail(origin, "'config' must map fields to lists of config.json keys")
    unsupported = [
        d.name
        for d in declared(ArchSpec)
        if "stacks" not in d.meta["documents"] and d.name != "tensors" and (d.meta["read"] or d.meta["accepted"])
    ]  # besides the structural keys and 'tensors' above
    if any(raw.get(name) is not None for name in unsupported):
        raise fail(
            origin, f"{', '.join(map(repr, unsupported[:-1]))} and {unsupported[-1]!r} are not supported with 'stacks'"
        )
    base = {k: v for k, v in raw.items() if k != "stacks"}
    stacks = []
    for name in STACK_NAMES:
        stack = stacks_raw[name]
        if (
            not isinstance(stack, dict)
            or "tensors" not in stack
            or not set(stack) <= {"config", "tensors"}
            or not isinstance(stack["tensors"], dict)
            or not isinstance(stack.get("config", {}), dict)
        ):
            raise fail(
                origin,
                f"stack {name!r} must be an object with 'tensors' (role -> rule) and optionally "
                f"'config' (its own config.json keys, over the shared ones)",
            )
        tensors = dict(stack["tensors"])
        cross_raw = {CROSS_ROLES[r]: tensors.pop(r) for r in CROSS_ROLES if r in tensors}
        where = f"{origin} (stack {name})"
        sub = _parse_one(
            {**base, "config": {**raw.get("config", {}), **stack.get("config", {})}, "tensors": tensors}, where
        )
        cross = _tensor_rules(cross_raw, ("q", "k", "v", "o"), where, "stacks.decoder.tensors")
        if name == "decoder" and set(cross) != {"q", "k", "v", "o"}:
            raise fail(
                where,
                f"the decoder needs its cross-attention as exactly {list(CROSS_ROLES)}; found "
                f"{sorted(r + '_cross' for r in cross)}",
            )
        if name == "encoder" and cross:
            raise fail(where, "the encoder has no cross-attention; the *_cross roles belong to the decoder")
        stacks.append(StackSpec(name, sub, cross))
    return replace(stacks[0].spec, tensors={}, stacks=tuple(stacks))


def _search(pattern: regex.Pattern, name: str, origin: str) -> bool:
    try:
        return bounded_search(pattern, name)
    except ValueError as exc:
        raise fail(origin, f"the ignore {exc}") from None


def _choice(raw: dict, key: str, choices, default: str, origin: str) -> str:
    """``raw[key]`` (``default`` when absent), one of ``choices``."""
    value = raw.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise fail(origin, f"'{key}' must be one of {list(choices)}, found {value!r}")
    return value


def _str_list(raw: dict, key: str, origin: str, required: bool = True) -> tuple[str, ...]:
    value = raw.get(key, None if required else [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(origin, f"'{key}' must be a list of strings, found {value!r}")
    return tuple(value)


def parse_spec(raw: Any, origin: str) -> ArchSpec:
    """Validate a decoded spec document and build the :class:`ArchSpec`.

    ``variants`` (a list of ``{"when": {config key: value or values}, ...overrides}``, ``when`` also a
    list of such conditions, any of which selects the variant): each variant
    is the document with its overrides merged in (objects merged key by key, ``null`` removing a
    key), validated as a spec of its own; :meth:`ArchSpec.for_config` picks one."""
    if not isinstance(raw, dict):
        raise fail(origin, "the document must be a JSON object")
    if not isinstance(raw.get("variants", []), list):
        raise fail(origin, "'variants' must be a list of objects")
    variants = []
    for i, variant in enumerate(raw.get("variants", [])):
        when = variant.get("when") if isinstance(variant, dict) else None
        conditions = when if isinstance(when, list) else [when]
        if not when or not all(isinstance(c, dict) and c for c in conditions):
            raise fail(
                origin,
                f"variant {i} must be an object with a non-empty 'when' (config key -> value or "
                f"list of values, or a list of such objects: any one selects the variant) and the "
                f"keys it overrides",
            )
        overrides = {k: v for k, v in variant.items() if k != "when"}
        fixed = [d.name for d in declared(ArchSpec) if "variant" not in d.meta["documents"]]
        if set(overrides) & set(fixed):
            raise fail(origin, f"variant {i} may not override {', '.join(map(repr, fixed[:-1]))} or {fixed[-1]!r}")
        merged = merge_documents({k: v for k, v in raw.items() if k != "variants"}, overrides)
        variants.append((tuple(dict(c) for c in conditions), parse_spec(merged, f"{origin} (variant {i})")))
    raw = {k: v for k, v in raw.items() if k != "variants"}
    spec = _parse_one(raw, origin)
    if variants:
        spec = replace(spec, variants=tuple(variants))
    return spec


def merge_documents(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in: objects key by key (recursively), a ``null`` removing
    the key, anything else replacing it."""
    out = dict(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_documents(out[key], value)
        else:
            out[key] = value
    return out


def _parse_one(raw: dict, origin: str) -> ArchSpec:
    """One spec document without variants, validated: every declared key read by :func:`.schema.read_keys`,
    then the rules between keys (which roles ``tensors`` needs)."""
    known = {d.name for d in declared(ArchSpec)}
    unknown = set(raw) - known
    if unknown:
        raise fail(origin, f"unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
    if "towers" in raw:
        return _parse_towered(raw, origin)
    if "projector" in raw:
        raise fail(origin, "'projector' belongs to a spec with 'towers' (a vision-language wrapper)")
    if "stacks" in raw:
        return _parse_stacked(raw, origin)
    values = read_keys(ArchSpec, raw, origin)
    tensors, experts, feed_forward = values["tensors"], values.get("experts"), values["feed_forward"]
    attention = ("o",) if values.get("latent") else ("qkv", "o") if "qkv" in tensors else ("q", "k", "v", "o")
    needed = attention + (() if experts else _ff_roles(feed_forward, tensors))
    absent = [r for r in needed if r not in tensors]
    extra = [r for r in tensors if r not in needed]
    if absent or extra:
        what = (
            "a mixture of experts (its feed-forward roles are under 'experts')"
            if experts
            else f"a {feed_forward} feed-forward"
        )
        raise fail(
            origin,
            f"{what} with {'fused' if 'qkv' in tensors else 'separate'} "
            f"q/k/v needs exactly the roles {list(needed)}; missing {absent}, unexpected {extra}",
        )
    return ArchSpec(origin=origin, **values)


def _config_keys(config: Any, raw: dict, origin: str) -> dict[str, tuple[str, ...]]:
    """``config``: each dimension's config.json keys; the required ones present (``ff_size`` may be left to
    ``ff_size_multiplier``)."""
    if not isinstance(config, dict):
        raise fail(origin, "'config' must map fields to lists of config.json keys")
    config_keys = {}
    for name in config:
        if name not in CONFIG_FIELDS + OPTIONAL_CONFIG_FIELDS:
            raise fail(
                origin, f"unknown config field {name!r}; allowed: {list(CONFIG_FIELDS + OPTIONAL_CONFIG_FIELDS)}"
            )
        config_keys[name] = _str_list(config, name, origin)
        if not config_keys[name] and name != "ff_size":
            raise fail(origin, f"config field {name!r} names no config.json key")
    # a fixed feed-forward width (BLOOM's 4 N) needs no config key: ff_size_multiplier gives it
    missing = [
        f
        for f in CONFIG_FIELDS
        if f not in config_keys and not (f == "ff_size" and raw.get("ff_size_multiplier") is not None)
    ]
    if missing:
        raise fail(origin, f"'config' lacks the required fields {missing}")
    return config_keys


def _block_switch(block_switch: Any, origin: str) -> dict[str, Any] | None:
    """``block_switch``: the block read from a boolean config key, each of its values a block."""
    if block_switch is None:
        return None
    keys = {"config_key", "default", "if_true", "if_false"}
    if not isinstance(block_switch, dict) or set(block_switch) != keys:
        raise fail(origin, f"'block_switch' must be an object with exactly the keys {sorted(keys)}")
    if not isinstance(block_switch["config_key"], str):
        raise fail(origin, f"'block_switch' config_key must be a string, found {block_switch['config_key']!r}")
    _choice(block_switch, "if_true", BLOCKS, "", origin)
    _choice(block_switch, "if_false", BLOCKS, "", origin)
    return block_switch


def _rotary(rotary: Any, origin: str) -> tuple[str | None, str | None, dict[str, Any]]:
    """``rotary``: the pairing, the ``off_when`` config key and the other options (:data:`ROTARY_OPTIONS`)."""
    if rotary is None:
        return None, None, {}
    if (
        not isinstance(rotary, dict)
        or "pairing" not in rotary
        or not set(rotary) <= {"pairing", *ROTARY_OPTIONS}
        or rotary["pairing"] not in PAIRINGS
        or not isinstance(rotary.get("off_when", ""), str)
    ):
        raise fail(
            origin,
            f"'rotary' must be an object {{\"pairing\": one of {list(PAIRINGS)}}} (how a head's "
            f"dimensions pair up under rotary position embeddings; optional keys "
            f"{sorted(ROTARY_OPTIONS)}, off_when naming a boolean config.json key that switches "
            f"rotary off, ALiBi instead), found {rotary!r}",
        )
    return rotary["pairing"], rotary.get("off_when"), _rotary_options(rotary, origin)


def _structure(raw: Any, origin: str) -> dict[str, str] | None:
    try:
        return validate_structure(raw)
    except ValueError as exc:
        raise fail(origin, str(exc)) from None


def _patterns(raw: dict, origin: str) -> tuple[regex.Pattern, ...]:
    """The document's ``ignore`` patterns, compiled."""
    return tuple(_compile(pattern, origin, "ignore") for pattern in _str_list(raw, "ignore", origin, required=False))


def _compile(pattern: str, origin: str, what: str) -> regex.Pattern:
    try:
        return compile_pattern(pattern)
    except ValueError as exc:
        raise fail(origin, f"{what} {exc}") from None


def _ff_roles(feed_forward: str, tensors: dict) -> tuple[str, ...]:
    """The feed-forward roles a block needs: a gated one's gate and up may be one fused ``ff_gate_up``."""
    if feed_forward == "gated" and "ff_gate_up" in tensors:
        return ("ff_gate_up", "ff_out")
    return FEED_FORWARDS[feed_forward]


def _tensor_rules(raw: Any, roles, origin: str, where: str, expert: bool = False) -> dict[str, TensorRule]:
    """``{role: TensorRule}`` from a ``{role: {name, layout[, fused]}}`` object; ``expert``: names must
    also contain ``${expert}``."""
    if not isinstance(raw, dict):
        raise fail(origin, f"'{where}' must map roles to {{name, layout}}")
    tensors = {}
    for role, rule in raw.items():
        if role not in roles:
            raise fail(origin, f"unknown role {role!r} in '{where}'; roles are {list(roles)}")
        fusions = FUSED_ROLES.get(role)
        allowed = (
            {"name", "layout"}
            | ({"fused"} if fusions else set())
            | ({"output_scale"} if role in SCALED_ROLES else set())
        )
        if not isinstance(rule, dict) or not {"name", "layout"} <= set(rule) <= allowed:
            raise fail(
                origin,
                f"tensor rule for {role!r} must be an object with the keys "
                f"{sorted(allowed)} ('fused' only, and always, for {' and '.join(FUSED_ROLES)}; "
                f"'output_scale' only for {' and '.join(SCALED_ROLES)})",
            )
        if fusions and (not isinstance(rule.get("fused"), str) or rule.get("fused") not in fusions):
            raise fail(origin, f"'fused' for {role} must be one of {list(fusions)}, found {rule.get('fused')!r}")
        if not isinstance(rule["name"], str) or LAYER_PLACEHOLDER not in rule["name"]:
            raise fail(origin, f"tensor name for {role!r} must contain {LAYER_PLACEHOLDER}")
        layouts = LAYOUTS + ((BANK,) if expert else ())
        if not isinstance(rule["layout"], str) or rule["layout"] not in layouts:
            raise fail(
                origin,
                f"layout for {role!r} must be one of {list(layouts)}, found {rule['layout']!r}"
                + ("" if expert else f" ('{BANK}' only for routed experts)"),
            )
        if expert and (rule["layout"] != BANK) != (EXPERT_PLACEHOLDER in rule["name"]):
            raise fail(
                origin,
                f"tensor name for {role!r} in '{where}' must "
                f"{'not ' if rule['layout'] == BANK else ''}contain {EXPERT_PLACEHOLDER} "
                f"(a '{BANK}' holds every expert in one tensor)",
            )
        if not expert and EXPERT_PLACEHOLDER in rule["name"]:
            raise fail(origin, f"tensor name for {role!r} in '{where}' must not contain {EXPERT_PLACEHOLDER}")
        scale = rule.get("output_scale")
        if scale is not None and (not isinstance(scale, str) or LAYER_PLACEHOLDER not in scale):
            raise fail(origin, f"output_scale for {role!r} must be a tensor name containing {LAYER_PLACEHOLDER}")
        tensors[role] = TensorRule(role, rule["name"], rule["layout"], rule.get("fused"), scale)
    return tensors


def _experts(raw: Any, feed_forward: str, config_keys: dict, origin: str) -> ExpertsSpec | None:
    """The ``experts`` object: ``router``, ``tensors`` (each expert's feed-forward roles) and optionally
    ``shared`` (``tensors`` and ``gate``); its sizes come from the config fields ``num_experts``,
    ``experts_per_token`` and, with a shared expert, ``shared_ff_size``."""
    if raw is None:
        return None
    optional = {"shared", "dense", "gates"}
    if not isinstance(raw, dict) or not {"router", "tensors"} <= set(raw) <= {"router", "tensors"} | optional:
        raise fail(
            origin, f"'experts' must be an object with 'router' and 'tensors' (and optionally {sorted(optional)})"
        )
    needs = (
        ["num_experts", "experts_per_token"]
        + (["shared_ff_size"] if "shared" in raw else [])
        + (["dense_ff_size"] if "dense" in raw else [])
    )
    missing = [f for f in needs if f not in config_keys]
    if missing:
        raise fail(origin, f"a mixture of experts needs the config fields {missing}")
    router = _tensor_rules({"router": raw["router"]}, ("router",), origin, "experts")["router"]
    tensors = _tensor_rules(
        raw["tensors"],
        FEED_FORWARDS["gated"] + FEED_FORWARDS["plain"] + ("ff_gate_up",),
        origin,
        "experts.tensors",
        expert=True,
    )
    if set(tensors) != set(_ff_roles(feed_forward, tensors)):
        raise fail(
            origin,
            f"'experts.tensors' of a {feed_forward} feed-forward needs exactly the roles "
            f"{list(_ff_roles(feed_forward, tensors))}, found {sorted(tensors)}",
        )
    shared = gate = None
    if "shared" in raw:
        part = raw["shared"]
        if not isinstance(part, dict) or not {"tensors"} <= set(part) <= {"tensors", "gate"}:
            raise fail(origin, "'experts.shared' must be an object with 'tensors' (and optionally 'gate')")
        shared = _tensor_rules(
            part["tensors"], FEED_FORWARDS[feed_forward] + ("ff_gate_up",), origin, "experts.shared.tensors"
        )
        if set(shared) != set(_ff_roles(feed_forward, shared)):  # its gate and up fused or not, as stored
            raise fail(
                origin,
                f"'experts.shared.tensors' needs the roles of a {feed_forward} feed-forward "
                f"{list(_ff_roles(feed_forward, shared))}, found {sorted(shared)}",
            )
        if "gate" in part:
            gate = _tensor_rules({"gate": part["gate"]}, ("gate",), origin, "experts.shared")["gate"]
    dense = layers = None
    if "dense" in raw:
        part = raw["dense"]
        rule = part.get("layers") if isinstance(part, dict) else None
        ranged = {"first", "last", "interval", "phase", "types", "expert_type"}  # DeepSeek, GLM, ERNIE
        ok = (
            isinstance(part, dict)
            and set(part) == {"tensors", "layers"}
            and isinstance(rule, dict)
            and (
                (set(rule) == {"list"} and isinstance(rule["list"], str))
                or (
                    "step" in rule
                    and set(rule) <= {"list", "step", "step_default"}
                    and isinstance(rule["step"], str)
                    and isinstance(rule.get("list", ""), str)
                    and isinstance(rule.get("step_default", 1), int)
                )
                or (
                    rule
                    and set(rule) <= ranged
                    and all(isinstance(rule[k], str) for k in set(rule) - {"phase"})
                    and rule.get("phase", 0) in (0, 1)
                    and ("types" in rule) == ("expert_type" in rule)
                )
            )
        )
        if not ok:
            raise fail(
                origin,
                "'experts.dense' must be an object with 'tensors' (the dense layers' feed-forward "
                "roles) and 'layers' ({\"list\": KEY} of the expert layers' indices, optionally "
                'with {"step": KEY, "step_default": n}: every n-th layer when the list is absent; '
                "or config keys of the 'first' and 'last' layers holding experts and their 'interval' "
                "with a 'phase' 0 or 1, layer l holding them when (l + phase) % interval == 0; or "
                "'types', a key listing each layer's type, with 'expert_type')",
            )
        dense = _tensor_rules(
            part["tensors"], FEED_FORWARDS[feed_forward] + ("ff_gate_up",), origin, "experts.dense.tensors"
        )
        if set(dense) != set(_ff_roles(feed_forward, dense)):
            raise fail(
                origin,
                f"'experts.dense.tensors' of a {feed_forward} feed-forward needs exactly the roles "
                f"{list(_ff_roles(feed_forward, dense))}, found {sorted(dense)}",
            )
        layers = dict(rule)
    gates = raw.get("gates", "softmax")
    gate_keys = {"scoring", "normalised", "normalised_default", "scale"}
    if isinstance(gates, dict):
        ok = (
            set(gates) <= gate_keys
            and gates.get("scoring", "softmax") in ("softmax", "sigmoid")
            and isinstance(gates.get("normalised", False), (bool, str))
            and isinstance(gates.get("normalised_default", False), bool)
            and isinstance(gates.get("scale", ""), str)
        )
        gates = dict(gates) if ok else gates
    else:
        ok = gates in ("softmax", "sigmoid")
    if not ok:
        raise fail(
            origin,
            f"'experts.gates' must be 'softmax' (the chosen gates sum to at most 1) or 'sigmoid' "
            f"(each at most 1), or an object with keys among {sorted(gate_keys)} (scoring, normalised "
            f"a boolean or a config key, scale the config key of routed_scaling_factor), found {gates!r}",
        )
    return ExpertsSpec(
        router=router, tensors=tensors, shared=shared, shared_gate=gate, dense=dense, layers=layers, gates=gates
    )


def _refusals(raw: Any, origin: str) -> tuple[Refusal, ...]:
    """``refuse``: ``{"tensor": pattern, "reason"}`` or ``{"config": key, "allowed": [values], "reason"}``."""
    if not isinstance(raw, list):
        raise fail(origin, f"'refuse' must be a list, found {raw!r}")
    out = []
    for item in raw:
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("reason"), str)
            and (
                (set(item) == {"tensor", "reason"} and isinstance(item["tensor"], str))
                or (
                    set(item) == {"config", "allowed", "reason"}
                    and isinstance(item["config"], str)
                    and isinstance(item["allowed"], list)
                )
            )
        )
        if not ok:
            raise fail(
                origin,
                f'each \'refuse\' entry must be {{"tensor": pattern, "reason": text}} or '
                f'{{"config": key, "allowed": [values], "reason": text}}, found {item!r}',
            )
        if "tensor" in item:
            out.append(Refusal(item["reason"], pattern=_compile(item["tensor"], origin, "refuse")))
        else:
            out.append(Refusal(item["reason"], config=item["config"], allowed=tuple(item["allowed"])))
    return tuple(out)


POSITION_TERMS = ("c2p", "p2c")  # DeBERTa: content-to-position, position-to-content


def _position_terms(raw: Any, origin: str) -> dict[str, Any] | None:
    """``{"config_key", "enabled_by", "requires"}``: the config key listing the disentangled terms
    (a list or a ``|``-joined string of ``c2p``/``p2c``), the boolean key that switches relative
    attention on, and config values the derivation needs (key -> a value the key's ``|``-split
    entries must contain)."""
    if raw is None:
        return None
    keys = {"config_key", "enabled_by", "requires"}
    if (
        not isinstance(raw, dict)
        or set(raw) != keys
        or not isinstance(raw["config_key"], str)
        or not isinstance(raw["enabled_by"], str)
        or not isinstance(raw["requires"], dict)
    ):
        raise fail(
            origin,
            f"'position_terms' must be an object with exactly the keys {sorted(keys)} "
            f"(config_key and enabled_by naming config.json keys, requires a key -> value map)",
        )
    return raw


# the rotary object's optional keys besides "pairing", each with its line in docs/architectures.md
ROTARY_OPTIONS = {
    "off_when": "a boolean config key that, when true, replaces rotary by ALiBi (Falcon)",
    "rope_type_aliases": 'a family\'s own names for rope types, e.g. `{"su": "longrope"}`',
    "legacy_layer_types": "how an older flat config gives local and global layers their bases: `pattern_key`, "
    "`pattern_default`, `local_theta_key`, `local_theta_default`, `global_theta_default`, "
    "`global_type`, and optionally `global_theta_key` (default `rope_theta`) and "
    "`global_layer` (`last` of each pattern, Gemma 3; `first`, ModernBERT)",
    "nope": 'the layers without rotary positions (their QK the plain bilinear matrix): `{"flags": KEY}` (a 0/1 '
    "list per layer, 0 unrotated: SmolLM3, Llama 4; optionally `interval_key`, `interval_default` when the "
    'list is absent) or `{"layer_types": [types], "window_key": KEY, "without_window": "rope" | '
    '"nope"}` (those layer types unrotated, every layer or none when the window key is null: EXAONE 4, '
    "Cohere2; optionally `pattern_key`, `pattern_default` for configs without `layer_types`)",
    "mrope": 'M-RoPE\'s position axes: `{"kind": "sections" | "interleaved", "default_section": [t, h, w]}` '
    "(the rope parameters' `mrope_section` assigns the frequencies to the time, height and width axes as "
    "contiguous runs, Qwen2-VL / Qwen2.5-VL, or interleaved, Qwen3-VL; `default_section` when the config "
    "gives none, as transformers does; docs/rotary.md section 7)",
    "grid": '2D rotary positions over a vision tower\'s patch grid (docs/rotary.md section 9): `{"frequencies": '
    '"alternating" | "split"}` (Pixtral\'s even and odd text frequencies on the rows and the columns, '
    "or Qwen's and Llama 4's `base^(-4j/d)` on each), optionally `first_axis` (`row`, or `column`: Llama "
    "4's first half turns with the column), `image_size` and `patch_size` (config keys of the largest grid, "
    "`image_size // patch_size` a side; absent: unbounded), `rope_types` (the rope types the model "
    "accepts), `class_token` (Llama 4's, at angle 0 before patches numbered from 1), `window` "
    '(`{"size", "merge", "patch", "full_layers"}`: config keys of Qwen2.5-VL\'s window attention, '
    "whose layers get their window's grid) and `defaults` (the config class's value of a key config.json "
    "leaves out)",
}
# "grid": 2D rotary over a vision tower's patch grid (docs/rotary.md section 9): how the pairs' frequencies and axes
# are laid out, which axis the first half turns with, the config keys of the largest grid (none: unbounded), the
# rope types the model accepts, Llama 4's class token and Qwen2.5-VL's window attention
_GRID = {
    "frequencies": str,
    "first_axis": str,
    "image_size": str,
    "patch_size": str,
    "rope_types": list,
    "class_token": bool,
    "window": dict,
    "defaults": dict,
}
_GRID_WINDOW = ("size", "merge", "patch", "full_layers")
# "nope": which layers have no rotary positions (NoPE): a per-layer flag list (SmolLM3, Llama 4:
# ``no_rope_layers``, 0 = no rotation) or the layer types left unrotated (Cohere2, EXAONE 4: the global
# layers), the latter with the config key of the window and what a model without one does
_NOPE_FLAGS = {"flags": str, "interval_key": str, "interval_default": int}
_NOPE_TYPES = {
    "layer_types": list,
    "window_key": str,
    "without_window": str,
    "pattern_key": str,
    "pattern_default": int,
}
_LEGACY_LAYER_TYPES = {
    "pattern_key": str,
    "pattern_default": int,
    "local_theta_key": str,
    "local_theta_default": (int, float),
    "global_theta_default": (int, float),
    "global_type": str,
}
# optional: the global layers' base key (default rope_theta), and which layer of each pattern is global
# ("last": Gemma 3, layer i when (i + 1) % pattern == 0; "first": ModernBERT, when i % pattern == 0)
_LEGACY_OPTIONAL = {"global_theta_key": str, "global_layer": str}


def _rotary_options(rotary: dict, origin: str) -> dict[str, Any]:
    """``rope_type_aliases`` (a family's own names for rope types, e.g. Phi-3's ``{"su": "longrope"}``)
    and ``legacy_layer_types`` (how an older flat config gives local and global layers their bases:
    Gemma 3's ``rope_local_base_freq`` and ``sliding_window_pattern``)."""
    out: dict[str, Any] = {}
    aliases = rotary.get("rope_type_aliases")
    if aliases is not None:
        if not isinstance(aliases, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
        ):
            raise fail(origin, f"'rotary' rope_type_aliases must map names to rope types, found {aliases!r}")
        out["rope_type_aliases"] = dict(aliases)
    legacy = rotary.get("legacy_layer_types")
    if legacy is not None:
        kinds = {**_LEGACY_LAYER_TYPES, **_LEGACY_OPTIONAL}
        if (
            not isinstance(legacy, dict)
            or not set(_LEGACY_LAYER_TYPES) <= set(legacy) <= set(kinds)
            or not all(isinstance(legacy[k], kinds[k]) and not isinstance(legacy[k], bool) for k in legacy)
            or legacy.get("global_layer", "last") not in ("first", "last")
        ):
            raise fail(
                origin,
                f"'rotary' legacy_layer_types must be an object with the keys "
                f"{sorted(_LEGACY_LAYER_TYPES)} (and optionally {sorted(_LEGACY_OPTIONAL)}, "
                f"global_layer 'first' or 'last'), found {legacy!r}",
            )
        out["legacy_layer_types"] = dict(legacy)
    nope = rotary.get("nope")
    if nope is not None:
        out["nope"] = _nope_rule(nope, origin)
    mrope = rotary.get("mrope")
    if mrope is not None:
        section = mrope.get("default_section") if isinstance(mrope, dict) else None
        if (
            not isinstance(mrope, dict)
            or set(mrope) != {"kind", "default_section"}
            or mrope["kind"] not in MROPE_KINDS
            or not isinstance(section, list)
            or not section
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in section)
        ):
            raise fail(
                origin,
                f"'rotary' mrope must be an object {{\"kind\": one of {list(MROPE_KINDS)}, "
                f'"default_section": [non-negative integers]}} (M-RoPE\'s axes of the frequencies, '
                f"the mrope_section used when the config gives none), found {mrope!r}",
            )
        out["mrope"] = {"kind": mrope["kind"], "default_section": list(section)}
    grid = rotary.get("grid")
    if grid is not None:
        out["grid"] = _grid_rule(grid, origin)
    return out


def _grid_rule(grid: Any, origin: str) -> dict[str, Any]:
    """The rotary object's ``grid`` (docs/rotary.md section 9): ``{"frequencies": "alternating" | "split"[,
    "first_axis": "row" | "column", "image_size": KEY, "patch_size": KEY, "rope_types": [types], "class_token":
    bool, "window": {"size", "merge", "patch", "full_layers": KEY}, "defaults": {KEY: value}]}`` (``defaults``: the
    values the model's config class gives a key config.json leaves out)."""
    window = grid.get("window") if isinstance(grid, dict) else None
    ok = (
        isinstance(grid, dict)
        and "frequencies" in grid
        and set(grid) <= set(_GRID)
        and all(isinstance(v, _GRID[k]) for k, v in grid.items())
        and grid["frequencies"] in ("alternating", "split")
        and grid.get("first_axis", "row") in ("row", "column")
        and ("image_size" in grid) == ("patch_size" in grid)
        and all(isinstance(t, str) for t in grid.get("rope_types", ["default"]))
        and bool(grid.get("rope_types", [1]))
        and (window is None or (set(window) == set(_GRID_WINDOW) and all(isinstance(v, str) for v in window.values())))
    )
    if not ok:
        raise fail(
            origin,
            f'\'rotary\' grid must be {{"frequencies": "alternating" or "split"[, "first_axis": '
            f'"row" or "column", "image_size" and "patch_size": config keys, "rope_types": '
            f'[types], "class_token": true or false, "window": {{{", ".join(_GRID_WINDOW)}: config '
            f'keys}}, "defaults": {{config key: value}}]}}, found {grid!r}',
        )
    return dict(grid)


def _nope_rule(nope: Any, origin: str) -> dict[str, Any]:
    """The rotary object's ``nope``: ``{"flags": KEY[, "interval_key", "interval_default"]}`` (a list of
    0/1 per layer, 0: no rotation; absent: every ``interval``-th layer unrotated) or ``{"layer_types":
    [types], "window_key": KEY, "without_window": "rope" | "nope"[, "pattern_key", "pattern_default"]}``
    (layers of those types unrotated; a config whose window key is null rotates every layer (``rope``)
    or none (``nope``); without ``layer_types`` in config.json, layer ``i`` is of the first listed type
    when ``(i + 1) % pattern == 0``)."""
    flags = isinstance(nope, dict) and "flags" in nope
    kinds = _NOPE_FLAGS if flags else _NOPE_TYPES
    required = {"flags"} if flags else {"layer_types", "window_key", "without_window"}
    ok = (
        isinstance(nope, dict)
        and required <= set(nope) <= set(kinds)
        and all(isinstance(nope[k], kinds[k]) and not isinstance(nope[k], bool) for k in nope)
    )
    if ok and not flags:
        ok = (
            nope["without_window"] in ("rope", "nope")
            and bool(nope["layer_types"])
            and all(isinstance(t, str) for t in nope["layer_types"])
        )
    if not ok:
        raise fail(
            origin,
            f'\'rotary\' nope must be {{"flags": config key[, "interval_key", "interval_default"]}} '
            f'or {{"layer_types": [types], "window_key": config key, "without_window": "rope" '
            f'or "nope"[, "pattern_key", "pattern_default"]}}, found {nope!r}',
        )
    return dict(nope)


def _qk_norm_rule(raw: Any, origin: str) -> QKNormRule | None:
    """The spec's ``qk_norm`` object: ``{"q": NAME, "k": NAME, "span": "head" | "all_heads", "gain":
    "weight" | "one_plus_weight", "eps": [config keys], "eps_default": number (optional)}``."""
    if raw is None:
        return None
    weightless = isinstance(raw, dict) and raw.get("gain") == "none"
    keys = {"span", "gain", "eps"} | (set() if weightless else {"q", "k"})
    optional = {"eps_default", "layers", "when", "when_default"}
    if not isinstance(raw, dict) or not keys <= set(raw) <= keys | optional:
        raise fail(
            origin,
            f"'qk_norm' must be an object with the keys {sorted(keys)} (and optionally "
            f"{sorted(optional)}; 'q' and 'k' name the gains, none with gain 'none'), found {raw!r}",
        )
    for role in () if weightless else ("q", "k"):
        if not isinstance(raw[role], str) or LAYER_PLACEHOLDER not in raw[role]:
            raise fail(origin, f"qk_norm tensor name for {role!r} must contain {LAYER_PLACEHOLDER}")
    span = _choice(raw, "span", QK_NORM_SPANS, "", origin)
    gain = _choice(raw, "gain", QK_NORM_GAINS, "", origin)
    layers = _choice(raw, "layers", ("all", "rotary"), "all", origin)
    if not isinstance(raw.get("when", ""), str) or not isinstance(raw.get("when_default", True), bool):
        raise fail(origin, "qk_norm 'when' must name a boolean config.json key and 'when_default' be true or false")
    eps = _str_list(raw, "eps", origin)
    default = raw.get("eps_default")
    if default is not None and (isinstance(default, bool) or not isinstance(default, (int, float)) or default <= 0):
        raise fail(origin, f"qk_norm eps_default must be a positive number, found {default!r}")
    return QKNormRule(
        raw.get("q"),
        raw.get("k"),
        span,
        gain,
        eps,
        None if default is None else float(default),
        layers=layers,
        when=raw.get("when"),
        when_default=raw.get("when_default", True),
    )


def load_spec_file(path: str | Path) -> ArchSpec:
    """Load a user's spec file (``--arch-spec FILE``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise SpecboundError(
            f"arch_spec must be the path of a JSON spec file (or an ArchSpec), found {type(path).__name__} {path!r}"
        )
    path = Path(path)
    if not path.is_file():
        found = "a folder" if path.is_dir() else "nothing"
        raise SpecboundError(
            f"architecture spec file not found: {path} is {found}; pass a JSON spec file (see docs/architectures.md)"
        )
    raw = load_json(path, "architecture spec", "the file must hold one JSON object (see docs/architectures.md)")
    return parse_spec(raw, str(path))


def stored_in_out(spec: ArchSpec):
    """``in_out(name)``: whether the family stores tensor ``name`` as ``(in, out)`` (a ``conv1d`` role
    tensor: GPT-2's ``Conv1D``) rather than ``(out, in)`` (``nn.Linear``), from the spec's tensor rules
    (every stack's, tower's and variant's, with any wrapper prefix); None when no rule names it in a
    family that has ``conv1d`` tensors (a family without any stores every weight ``(out, in)``).
    What a LoRA update's orientation follows (:meth:`~specbound.io.lora.LoraCheckpoint.use_layouts`)."""
    rules, pending = [], [spec]
    while pending:
        s = pending.pop()
        rules += list(s.tensors.values()) + [r for st in (s.stacks or ()) for r in st.cross.values()]
        pending += [st.spec for st in (s.stacks or ())] + [t.spec for t in (s.towers or ()) if t.spec is not None]
        pending += [v for _, v in s.variants]
    patterns = [
        (re.compile(r"(?:.*\.)?" + re.escape(r.name).replace(re.escape("${layer}"), r"\d+") + "$"), r.layout)
        for r in rules
        if isinstance(r.name, str)
    ]
    conv1d = any(layout == "conv1d" for _, layout in patterns)

    def in_out(name: str) -> bool | None:
        found = {layout for pattern, layout in patterns if pattern.match(name)}
        if found:
            return None if len(found) != 1 else found == {"conv1d"}
        return None if conv1d else False

    return in_out
