"""Reading a model's structure from its tensor names alone (for ``specbound arch infer``).

* :func:`find_layer_stack`: the repeated block, a dotted path followed by an index ``0..L-1``
  (``encoder.layer.<i>.…``) holding the most 2-D tensors;
* :func:`assign_roles`: which weight of a layer is ``q``, ``k``, ``v`` (or a fused ``qkv``), ``o`` and
  the feed-forward matrices, from the module names (:data:`ROLE_RULES`);
* :func:`find_expert_stack`: a mixture of experts' repeated expert inside a layer
  (``block_sparse_moe.experts.<e>.…``);
* :func:`ignore_patterns`: regular expressions for every other tensor.

Names only: the sizes and orientations these roles imply are checked in ``archinfer.py``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from .spec import FEED_FORWARDS, ROLES
from ..io import Checkpoint
from ..errors import SpecboundError

# The weight's module path relative to its layer (``attention.self.query``) -> role: the first rule
# that matches (case-insensitively) wins, so ``attention.output.dense`` is ``o`` before ``output.dense``
# can be ``ff_out``, and ``attn.c_proj`` is ``o`` before ``c_proj`` can be ``ff_out``.
_IN_ATTENTION = r"(?:^|\.)\w*att\w*\.(?:.*\.)?"  # an attention module on the path (attn, attention, SelfAttention)
ROLE_RULES = (
    ("qkv", r"(?:^|\.)(?:qkv|qkv_proj|c_attn|query_key_value|wqkv|w_pack|in_proj)$"),
    ("q", r"(?:^|\.)(?:q|query|q_proj|q_lin|wq|query_proj)$"),
    ("k", r"(?:^|\.)(?:k|key|k_proj|k_lin|wk|key_proj)$"),
    ("v", r"(?:^|\.)(?:v|value|v_proj|v_lin|wv|value_proj)$"),
    ("o", _IN_ATTENTION + r"(?:o|o_proj|out_proj|out_lin|wo|dense|c_proj|proj|output\.dense)$"),
    ("ff_gate_up", r"(?:^|\.)(?:gate_up_proj|gate_up|w13)$"),
    ("ff_gate", r"(?:^|\.)(?:gate_proj|gate|wi_0)$"),
    ("ff_up", r"(?:^|\.)(?:up_proj|wi_1)$"),
    ("ff_in", r"(?:^|\.)(?:fc1|c_fc|dense_h_to_4h|lin1|fc_in|wi|linear1|intermediate\.dense|w1)$"),
    ("ff_out", r"(?:^|\.)(?:fc2|c_proj|dense_4h_to_h|lin2|fc_out|wo|linear2|down_proj|output\.dense|w2)$"),
)
_WRAPPERS = ("model", "transformer", "base_model")
_NORM = re.compile(r"(norm|(^|\.)ln_?\w*)\.(weight|scale)$", re.IGNORECASE)


@dataclass(frozen=True)
class LayerStack:
    """``<path>.<i>.<rest>`` for ``i = 0..L-1``.

    Attributes
    ----------
    path : str
        The dotted path before the index (``bert.encoder.layer``).
    L : int
        Number of layers.
    rests : dict[int, frozenset[str]]
        Each layer's tensor names after the index (``attention.self.query.weight``).
    """

    path: str
    L: int
    rests: dict[int, frozenset[str]]

    def name(self, layer: int, rest: str) -> str:
        return f"{self.path}.{layer}.{rest}"

    @property
    def everywhere(self) -> frozenset[str]:
        """The rests every layer has."""
        return frozenset.intersection(*self.rests.values())

    @property
    def anywhere(self) -> frozenset[str]:
        """The rests some layer has."""
        return frozenset.union(*self.rests.values())


def _indexed_paths(ckpt: Checkpoint) -> tuple[dict[str, dict[int, set[str]]], list[str]]:
    """Every dotted path followed by an index (path -> index -> the rests after it), and those that can
    be a layer stack: indices ``0..L-1``, not an expert stack, and not a single index wrapping a
    deeper stack of several layers (sentence-transformers' ``0.auto_model``)."""
    stacks: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name in ckpt.names:
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part.isdigit():
                stacks[".".join(parts[:i])][int(part)].add(".".join(parts[i + 1 :]))
    # a mixture of experts' experts are inside a layer, never the layer stack
    candidates = [
        p
        for p, by in stacks.items()
        if p
        and set(by) == set(range(len(by)))
        and not _is_expert_path(p)
        and not (
            len(by) == 1
            and any(q.startswith(p + ".") and len(stacks[q]) > 1 and not _is_expert_path(q) for q in stacks)
        )
    ]
    return stacks, candidates


def _matrix_count(ckpt: Checkpoint, path: str, by_index: dict[int, set[str]]) -> int:
    """How many 2-D tensors the stack at ``path`` holds, over all its layers."""
    return sum(len(ckpt.shape(f"{path}.{i}.{r}")) == 2 for i, rests in by_index.items() for r in rests)


def find_layer_stack(ckpt: Checkpoint, layers: int | None = None) -> LayerStack:
    """The path followed by an index running ``0..L-1`` that holds the most 2-D tensors.

    Every index of a name makes a candidate (``model.0.auto_model.encoder.layer.3.…``: ``model`` and
    ``model.0.auto_model.encoder.layer``), but a single index ``0`` above a deeper stack of several
    layers is a wrapper (``nn.Sequential``: sentence-transformers' ``0.auto_model``), not a stack; an
    index inside a stack's layers belongs to the layer (``experts.3`` inside ``layers.0``: ``layers``
    holds more weights).  ``layers`` (the config's layer count, when known) is preferred over
    any other index range.  Two equally good paths (an encoder-decoder's two stacks) are an error."""
    stacks, candidates = _indexed_paths(ckpt)
    scored = [(len(stacks[path]) == layers, _matrix_count(ckpt, path, stacks[path]), path) for path in candidates]
    matching = any(match for match, _, _ in scored)  # a stack of the config's layer count outranks the rest
    scored = sorted(((m, p) for match, m, p in scored if match == matching), reverse=True)
    if not scored or scored[0][0] == 0:
        raise SpecboundError(
            f"{ckpt.location}: no repeated layer found (a path like encoder.layer.<i>.* with i = 0..L-1 "
            f"holding 2-D weights); write the spec by hand (docs/architectures.md)"
        )
    if len(scored) > 1 and scored[1][0] == scored[0][0]:
        raise SpecboundError(
            f"{ckpt.location}: two layer stacks hold equally many weights ({scored[0][1]!r}, {scored[1][1]!r}): "
            f"an encoder-decoder is not one chain of blocks; write the spec by hand for the part to analyse"
        )
    path = scored[0][1]
    return LayerStack(path, len(stacks[path]), {i: frozenset(r) for i, r in stacks[path].items()})


def find_layer_stacks(ckpt: Checkpoint) -> list[LayerStack]:
    """Every top-level layer stack holding 2-D weights, most weights first: the candidates of
    :func:`find_layer_stack` that are neither a wrapper around a deeper stack nor an index inside
    another stack's layers (``encoder.block.0.layer`` inside ``encoder.block``).  An encoder-decoder
    has two (``encoder.block``, ``decoder.block``), a two-tower model too (``text_model.encoder.layers``,
    ``vision_model.encoder.layers``)."""
    stacks, candidates = _indexed_paths(ckpt)
    inner = re.compile(r"\.\d+\.")
    top = [
        p
        for p in candidates
        if not any(p.startswith(q + ".") and inner.match(p[len(q) :] + ".") for q in candidates if q != p)
    ]
    scored = [(m, p) for p in top if (m := _matrix_count(ckpt, p, stacks[p]))]
    return [
        LayerStack(p, len(stacks[p]), {i: frozenset(r) for i, r in stacks[p].items()})
        for _, p in sorted(scored, key=lambda x: (-x[0], x[1]))
    ]


# A decoder layer's cross-attention module (queries from its stream, keys and values from the
# encoder's output): BART/Whisper encoder_attn, T5 EncDecAttention, BERT-generation crossattention.
CROSS_ATTENTION = re.compile(
    r"(?:^|\.)(?:encoder_attn|encdecattention|cross_?attn|crossattention|cross_attention"
    r"|enc_dec_attn|src_attn)(?:\.|$)",
    re.IGNORECASE,
)


def is_cross_attention(rest: str) -> bool:
    """Whether a layer-relative weight belongs to a cross-attention module."""
    return CROSS_ATTENTION.search(module_of(rest)) is not None


def assign_attention_roles(matrices: list[str]) -> dict[str, str]:
    """``q``, ``k``, ``v``, ``o`` (or ``qkv``, ``o``) of one attention block's 2-D weights, by
    :data:`ROLE_RULES`; anything else, or a role seen twice or missing, is an error naming them."""
    found: dict[str | None, list[str]] = defaultdict(list)
    for rest in matrices:
        role = next(
            (
                r
                for r, rule in ROLE_RULES
                if r in ("q", "k", "v", "qkv", "o") and re.search(rule, module_of(rest), re.IGNORECASE)
            ),
            None,
        )
        found[role].append(rest)
    roles = {r: names[0] for r, names in found.items() if r is not None and len(names) == 1}
    needed = ("qkv", "o") if "qkv" in roles else ("q", "k", "v", "o")
    if found.get(None) or any(len(n) > 1 for r, n in found.items() if r) or set(roles) != set(needed):
        raise SpecboundError(
            f"cannot place the cross-attention weights {', '.join(matrices)} as q, k, v, o (recognised: "
            f"{', '.join(f'{r}={n}' for r, n in roles.items()) or 'none'}); write the spec by hand"
        )
    return roles


def _is_expert_path(path: str) -> bool:
    """Whether ``path`` ends in an expert stack's name (``…block_sparse_moe.experts``)."""
    return re.search(r"experts?$", path, re.IGNORECASE) is not None


def wrapper_prefix(stack_path: str, config: dict) -> str:
    """``"bert."`` for ``bert.encoder.layer``: a first component that names the base model (a usual
    wrapper attribute, the model_type, or the start of an ``architectures`` class name); else ``""``."""
    first, _, rest = stack_path.partition(".")
    if not rest:
        return ""
    classes = [str(a).lower() for a in config.get("architectures") or []]  # GPTNeoXForCausalLM: gpt_neox.
    if (
        first in _WRAPPERS
        or first == config.get("model_type")
        or any(c.startswith(first.lower().replace("_", "")) for c in classes)
    ):
        return first + "."
    return ""


def module_of(rest: str) -> str:
    """``attention.self.query.weight`` -> ``attention.self.query`` (also ``self_attn.in_proj_weight``)."""
    return re.sub(r"(\.|_)weight$", "", rest)


def leaf(rest: str) -> str:
    """The module's own name: ``attention.self.query.weight`` -> ``query``."""
    return module_of(rest).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class RoleAssignment:
    """Role -> layer-relative weight name, the 2-D weights that matched no role, and whether Meta
    LLaMA's ``w1``/``w2``/``w3`` naming decided the gated feed-forward."""

    roles: dict[str, str]
    unmatched: tuple[str, ...]
    meta_llama: bool = False


PARTS = {"layer": ("attention", "feed_forward"), "attention": ("attention",), "feed_forward": ("feed_forward",)}


def assign_roles(matrices: list[str], part: str = "layer") -> RoleAssignment:
    """Assign the 2-D weights of one layer to roles by :data:`ROLE_RULES`.

    ``w1, w2, w3`` together are Meta LLaMA's ``w2(silu(w1 x) * w3 x)`` (gate, down, up); an
    ``up_proj`` without a gate is a plain ``ff_in``; a ``gate_up_proj`` is a fused ``ff_gate_up``.  Two
    weights for one role (experts not found as an expert stack, a second attention block), a fused
    ``qkv`` beside separate ``q``/``k``/``v``, or a missing role is an error.  ``part``: ``"layer"``
    (attention and feed-forward), ``"attention"`` (a mixture of experts' layer without its experts) or
    ``"feed_forward"`` (one expert).
    """
    found: dict[str | None, list[str]] = defaultdict(list)
    for rest in matrices:
        role = next((r for r, rule in ROLE_RULES if re.search(rule, module_of(rest), re.IGNORECASE)), None)
        found[role].append(rest)
    leaves = {leaf(r).lower(): r for r in matrices}
    meta_llama = {"w1", "w2", "w3"} <= set(leaves)
    if meta_llama:
        found["ff_in"].remove(leaves["w1"])
        found[None].remove(leaves["w3"])
        found["ff_gate"].append(leaves["w1"])
        found["ff_up"].append(leaves["w3"])
    if found["ff_up"] and not found["ff_gate"]:
        found["ff_in"] += found.pop("ff_up")
    unmatched = tuple(found.pop(None, []))
    for role, names in found.items():
        if len(names) > 1:
            raise SpecboundError(
                f"several weights of one layer look like the {role} role ({', '.join(names)}): a second "
                f"attention block or feed-forward is not one chain of matrices; write the spec by hand"
            )
    roles = {r: found[r][0] for r in ROLES if found.get(r)}
    if "qkv" in roles and {"q", "k", "v"} & set(roles):
        raise SpecboundError(
            f"a layer has both a fused qkv weight ({roles['qkv']}) and separate q/k/v weights; write the spec by hand"
        )
    attention = ("qkv", "o") if "qkv" in roles else ("q", "k", "v", "o")
    if "ff_gate_up" in roles:
        feed_forward = ("ff_gate_up", "ff_out")
    else:
        feed_forward = FEED_FORWARDS["gated" if "ff_gate" in roles else "plain"]
    wanted = {"attention": attention, "feed_forward": feed_forward}
    needed = tuple(r for kind in PARTS[part] for r in wanted[kind])
    other = [roles.pop(r) for r in list(roles) if r not in needed]
    if other:
        where = {
            "feed_forward": "an expert holds attention-like weights",
            "attention": "a layer holds feed-forward weights beside its experts",
            "layer": "a layer holds more feed-forward weights than one block has",
        }[part]
        raise SpecboundError(f"{where} ({', '.join(other)}): not one chain of matrices; write the spec by hand")
    missing = [r for r in needed if r not in roles]
    if missing:
        recognised = ", ".join(f"{r}={n}" for r, n in roles.items()) or "none recognised"
        raise SpecboundError(
            f"cannot tell which weight plays the role(s) {', '.join(missing)}: "
            f"{'an expert' if part == 'feed_forward' else 'a layer'}'s 2-D weights are "
            f"{', '.join(matrices)} ({recognised}); write the spec by hand (docs/architectures.md)"
        )
    return RoleAssignment(roles, unmatched, meta_llama)


@dataclass(frozen=True)
class ExpertStack:
    """A mixture of experts' repeated expert inside a layer: ``<path>.<e>.<rest>`` for ``e = 0..E-1``.

    Attributes
    ----------
    path : str
        Relative to the layer (``block_sparse_moe.experts``).
    count : int
        ``E``.
    rests : frozenset[str]
        Each expert's tensors after its index (``w1.weight``).
    """

    path: str
    count: int
    rests: frozenset[str]

    def rest(self, expert: int | str, rest: str) -> str:
        return f"{self.path}.{expert}.{rest}"

    def members(self) -> set[str]:
        """Every layer-relative name the stack holds."""
        return {self.rest(e, r) for e in range(self.count) for r in self.rests}


_EXPERT_INDEX = re.compile(r"^(?P<path>(?:.*\.)?\w*experts?)\.(?P<index>\d+)\.(?P<rest>.+)$", re.IGNORECASE)


def find_expert_stack(layer_rests: frozenset[str]) -> ExpertStack | None:
    """The expert stack of one layer's tensor names (a path ending in ``expert`` / ``experts``,
    then an index ``0..E-1``, every expert with the same tensors), or None.  Two stacks, indices with
    gaps or experts of different make-up are errors (not one mixture a spec can describe)."""
    stacks: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for rest in layer_rests:
        match = _EXPERT_INDEX.match(rest)
        if match:
            stacks[match["path"]][int(match["index"])].add(match["rest"])
    if not stacks:
        return None
    if len(stacks) > 1:
        raise SpecboundError(
            f"a layer holds several expert stacks ({', '.join(sorted(stacks))}): not one mixture "
            f"of experts; write the spec by hand"
        )
    path, by_index = next(iter(stacks.items()))
    if set(by_index) != set(range(len(by_index))) or len({frozenset(r) for r in by_index.values()}) != 1:
        raise SpecboundError(
            f"the experts under {path} are not numbered 0..E-1 with the same tensors each "
            f"(indices {sorted(by_index)[:8]}): write the spec by hand"
        )
    return ExpertStack(path, len(by_index), frozenset(by_index[0]))


def norms_per_layer(stack: LayerStack) -> int:
    """How many normalisation weights every layer has (``ln_1.weight``, ``input_layernorm.weight``)."""
    return sum(1 for rest in stack.everywhere if _NORM.search(rest))


def ignore_patterns(
    names: list[str], stack: LayerStack, prefix: str, role_rests: set[str]
) -> tuple[list[str], list[str]]:
    """:func:`stacks_ignore_patterns` of one stack."""
    return stacks_ignore_patterns(names, [(stack, role_rests)], prefix)


def stacks_ignore_patterns(
    names: list[str], stacks: list[tuple[LayerStack, set[str]]], prefix: str
) -> tuple[list[str], list[str]]:
    """Patterns for every tensor that is not a role weight, and the per-layer rests they cover.

    ``\\.bias$``; each other per-layer tensor exactly (``^encoder\\.layer\\.\\d+\\.output\\.LayerNorm\\.weight$``);
    and each module outside the stack by its shortest path that is not on the stack's path
    (``^embeddings\\.``, ``^decoder\\.final_layer_norm\\.``), so no pattern can match a role weight.
    Patterns are written relative to ``prefix`` (ignore patterns are also tried with it removed).
    """
    patterns = [r"\.bias$"] if any(n.endswith(".bias") for n in names) else []
    in_layer = []
    for stack, role_rests in stacks:
        stack_rel = stack.path[len(prefix) :]
        rests = sorted(r for r in stack.anywhere - role_rests if not r.endswith(".bias"))
        patterns += [f"^{re.escape(stack_rel)}\\.\\d+\\.{re.escape(rest)}$" for rest in rests]
        in_layer += rests
    all_parts = [stack.path[len(prefix) :].split(".") for stack, _ in stacks]
    outside = set()
    for name in names:
        if any(name.startswith(stack.path + ".") for stack, _ in stacks) or name.endswith(".bias"):
            continue
        parts = (name[len(prefix) :] if prefix and name.startswith(prefix) else name).split(".")
        k = max(_diverges(parts, stack_parts) for stack_parts in all_parts)
        outside.add(f"^{re.escape('.'.join(parts[:k]))}" + ("\\." if k < len(parts) else "$"))
    return patterns + sorted(outside), in_layer


def _diverges(parts: list[str], stack_parts: list[str]) -> int:
    """How many leading components of a name make a path that is not on the stack's path."""
    if parts == stack_parts[: len(parts)]:
        return len(parts)
    return next(i + 1 for i in range(len(parts)) if i >= len(stack_parts) or parts[i] != stack_parts[i])
