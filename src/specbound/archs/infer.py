"""``specbound arch infer``: draft an architecture spec from a checkpoint's names, shapes and config.

For a family specbound does not ship.  The draft is a starting point, not a verdict: every choice is
recorded as a :class:`Guess` with its evidence, and the ones the checkpoint cannot decide are marked
*verify*:

* the layer stack, roles and ignore patterns come from the tensor names (``tensor_names.py``), and
  the roles are cross-checked by shapes: every role matrix must share the hidden size ``N``, the
  feed-forward ones the width ``d_ff``;
* layouts come from shapes only where they decide it: a non-square ``(d_ff, N)`` feed-forward weight
  is an ``nn.Linear`` ``(out, in)``.  **A square matrix cannot reveal its orientation**: its layout
  is taken from the non-square weights of the same layer (or assumed ``linear``) and marked verify;
* a fused ``qkv``'s split (``concat`` ``[q | k | v]`` or ``per_head``) cannot be told from shapes
  either: guessed from the name (``query_key_value`` is GPT-NeoX's and BLOOM's per-head layout) and
  marked verify; so is the block structure (a parallel attention/feed-forward block is invisible in
  the weights; one normalisation per layer or a ``*parallel*`` config flag hints at it);
* config keys by matching config.json's values to the observed sizes (``hidden_size = 32`` is the
  width all role matrices share), usual key names first; the number of heads is not visible in the
  weights at all and comes from the key's name;
* a mixture of experts (an expert stack ``<...>.experts.<e>.*`` inside each layer) becomes an
  ``experts`` section: the experts' feed-forward roles, the router (the ``(E, N)`` weight named like a
  gate or router), and a shared expert with its gate when there is one.  How the router weighs its
  experts is not in the weights (the derivation needs gates >= 0 summing to at most 1): marked verify.
  Weights no spec can describe are refused with a line naming them: 3-D expert banks, two expert
  stacks, a dense feed-forward beside the experts, a router that cannot be found;
* so are the weights of blocks outside the spec schema (``UNMODELLED``), with the layers that hold
  them: linear-attention and state-space blocks (``A_log``, ``dt_bias``, Mamba's ``x_proj``, gated
  DeltaNet's ``in_proj_qkvz``), causal convolutions over the tokens (a 3-D ``conv1d.weight``), multi-head
  latent attention (``q_a_proj``, ``kv_a_proj_with_mqa``), attention sinks (``sinks``) and routers with a
  score-correction bias (``e_score_correction_bias``).

The draft is finally run through ``analyze``'s own accounting and shape checks on the checkpoint it
came from (:func:`self_check`), so a draft that does not fit says so before it is used.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .binding import account_for_tensors, detect_prefix, infer_kv_heads, model_dims
from .hybrids import RECURRENT_WEIGHT, RECURRENT_WHAT, RECURRENT_WHY
from .registry import builtin_specs, referenced_family
from .spec import LAYER_PLACEHOLDER, parse_spec
from .stacks import bind
from ..io import FLOAT_DTYPES, Checkpoint
from ..errors import SpecboundError, index_ranges as ranges
from .tensor_names import (
    ExpertStack,
    LayerStack,
    RoleAssignment,
    assign_attention_roles,
    assign_roles,
    find_expert_stack,
    find_layer_stack,
    find_layer_stacks,
    ignore_patterns,
    is_cross_attention,
    leaf,
    module_of,
    norms_per_layer,
    stacks_ignore_patterns,
    wrapper_prefix,
)
from .towers import tower_spec, tower_views

# config.json keys by field, most usual first.  A key is used only when its value matches what the
# weights show (except the number of heads, which the weights do not show).
CONFIG_NAMES = {
    "num_layers": (
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "encoder_layers",
        "decoder_layers",
        "num_decoder_layers",
    ),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "width"),
    "num_heads": (
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "nhead",
    ),
    "num_kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "d_kv", "attention_head_size", "kv_channels"),
    "ff_size": (
        "intermediate_size",
        "ffn_dim",
        "n_inner",
        "hidden_dim",
        "d_ff",
        "ffn_hidden_size",
        "dim_feedforward",
        "mlp_dim",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "moe_intermediate_size",
    ),
    "activation": ("hidden_act", "activation_function", "activation", "hidden_activation", "act_fn", "dense_act_fn"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_layer"),
    "experts_per_token": ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k", "n_experts_per_tok"),
    "shared_ff_size": ("shared_expert_intermediate_size", "shared_intermediate_size", "moe_shared_intermediate_size"),
}
# a mixture of experts' router and its shared expert's gate, by module name
_ROUTER = r"(?:^|\.)(?:gate|router|gate_inp|wg|moe_gate|switch)$"
_SHARED = r"(?:^|\.)shared_experts?\."
_STORAGE = {"linear": "nn.Linear (out, in)", "conv1d": "Conv1D (in, out)"}


@dataclass(frozen=True)
class Guess:
    """One decision of the draft, its evidence, and whether the user must check it."""

    topic: str
    choice: str
    evidence: str
    verify: bool = False


@dataclass
class Draft:
    """A drafted spec (the JSON document), the guesses behind it and the self-check's outcome."""

    spec: dict[str, Any] = field(default_factory=dict)
    guesses: list[Guess] = field(default_factory=list)
    check: str = ""

    def note(self, topic: str, choice: str, evidence: str, verify: bool = False) -> None:
        self.guesses.append(Guess(topic, choice, evidence, verify))

    @property
    def to_verify(self) -> list[Guess]:
        return [g for g in self.guesses if g.verify]

    def report(self) -> str:
        """Every guess with its evidence, then what the user must verify (for stderr)."""
        lines = [
            f"drafted spec for model_type {self.spec['model_types'][0]!r}; each guess, its evidence, and "
            f"VERIFY where the checkpoint cannot decide:",
            "",
        ]
        for g in self.guesses:
            lines += [f"{'VERIFY' if g.verify else '      '}  {g.topic}: {g.choice}", f"          {g.evidence}"]
        lines += ["", f"self-check on this checkpoint: {self.check}"]
        if self.to_verify:
            lines += [
                "",
                f"{len(self.to_verify)} guess(es) the weights cannot decide; check them against the "
                f"model's code before trusting the numbers:",
            ]
            lines += [f"  - {g.topic}: {g.choice}" for g in self.to_verify]
        return "\n".join(lines)


@dataclass(frozen=True)
class Sizes:
    """What the role weights' shapes say: hidden size ``N``, feed-forward width ``d_ff``, attention
    width ``H d_h`` (o's input) and key/value width ``H_kv d_h``."""

    N: int
    d_ff: int
    attention: int
    kv: int


@dataclass
class MoEParts:
    """What a mixture-of-experts layer is made of (layer-relative names): the expert stack, each
    expert's roles (expert 0's names), the router, the shared expert's roles and its gate."""

    experts: ExpertStack
    roles: RoleAssignment
    router: str
    shared: dict[str, str] = field(default_factory=dict)
    shared_gate: str | None = None

    def role_rests(self) -> set[str]:
        """Every layer-relative name these parts read."""
        rests = {self.experts.rest(e, r) for e in range(self.experts.count) for r in self.roles.roles.values()}
        return rests | {self.router, *self.shared.values(), *([self.shared_gate] if self.shared_gate else [])}


def infer_spec(ckpt: Checkpoint, inferred: Sequence[Any] = ()) -> Draft:
    """Draft a spec for ``ckpt`` (module docstring).  The draft always validates with ``parse_spec``;
    :attr:`Draft.check` says whether it also fits ``ckpt``.  ``inferred``: what
    :func:`~.graph_config.complete_config` inferred of an export without config.json (what its graph said,
    :class:`~.graph_config.Inferred` rows; graph_config imports this module)."""
    draft = Draft()
    for note in inferred:
        draft.note(
            f"config.json {note.field}",
            str(note.value),
            f"no config.json; inferred: {note.evidence}",
            verify=note.field in ("num_heads", "activation"),
        )
    config = ckpt.config
    model_type = str(config.get("model_type") or "custom")
    shape = two_chains(find_layer_stacks(ckpt), config)
    if shape is not None:
        return _infer_two(ckpt, draft, model_type, *shape)
    wrapper = _infer_wrapper(ckpt, draft, model_type) if isinstance(config.get("text_config"), dict) else None
    if wrapper is not None:  # a vision-language wrapper: towers that name families
        return wrapper
    stack = find_layer_stack(
        ckpt, next((config[k] for k in CONFIG_NAMES["num_layers"] if _is_int(config.get(k))), None)
    )
    prefix = wrapper_prefix(stack.path, config)
    stack_rel = stack.path[len(prefix) :]
    _note_stack(stack, prefix, ckpt, draft)
    refuse_unmodelled(ckpt, stack)
    _refuse_banks(ckpt, stack)
    matrices = sorted(
        r
        for r in stack.rests[0]
        if len(ckpt.shape(stack.name(0, r))) == 2 and ckpt.dtype(stack.name(0, r)) in FLOAT_DTYPES
    )
    experts = find_expert_stack(stack.rests[0])
    moe = None if experts is None else moe_parts(ckpt, stack, experts, matrices)
    assignment = (
        assign_roles(matrices)
        if moe is None
        else assign_roles(
            [m for m in matrices if m not in moe.role_rests() and not m.startswith(experts.path + ".")],
            part="attention",
        )
    )
    roles = dict(assignment.roles)
    if moe is not None:  # the experts' roles, by expert 0's names, for the sizes and layouts
        roles.update({r: experts.rest(0, rest) for r, rest in moe.roles.roles.items()})
    tensors, keys, extra, sizes = _drafted_tensors(ckpt, stack, stack_rel, roles, assignment, config, draft)
    experts_spec = None
    if moe is not None:
        experts_spec = _experts_section(moe, tensors, stack, stack_rel, ckpt, config, sizes, keys, draft)
    qk_norm, norm_rests = _qk_norm(ckpt, stack, prefix, config, sizes, keys, draft)
    used = set(assignment.roles.values()) | (moe.role_rests() if moe else set()) | norm_rests
    patterns, in_layer = ignore_patterns(ckpt.names, stack, prefix, used)
    _note_ignored(patterns, in_layer, stack_rel, draft)
    draft.spec = {
        "family": model_type,
        "description": f"drafted by `specbound arch infer` from {ckpt.location}; verify before trusting it",
        "model_types": [model_type],
        "prefixes": ["", prefix] if prefix else [""],
        "config": keys,
        **_block(config, stack, draft),
        **_positions(config, draft),
        **_disentangled(config, draft),
        **qk_norm,
        "feed_forward": "gated" if {"ff_gate", "ff_gate_up"} & set(roles) else "plain",
        **extra,
        "tensors": tensors,
        **({"experts": experts_spec} if experts_spec else {}),
        "ignore": patterns,
    }
    parse_spec(draft.spec, "the drafted spec")  # an invalid draft is a bug here, not the user's problem
    draft.check = self_check(draft.spec, ckpt)
    return draft


# Weights of blocks arch infer does not draft, each (pattern on a layer-relative name, what it is, why
# it is refused, whether only a 3-D weight matches, what to do); the first kind found in any layer is
# refused, naming the weight and the layers that hold its kind.  Never drafted as ignored: each
# changes the function.
_NO_SPEC = "no spec can describe it, so arch infer drafts none (docs/families.md)"
_BY_HAND = (
    "arch infer does not draft it: write the spec by hand, after a shipped family of the same layout if "
    "there is one (docs/architectures.md)"
)
UNMODELLED = (
    (RECURRENT_WEIGHT, RECURRENT_WHAT, RECURRENT_WHY, False, _NO_SPEC),
    (
        r"(?:^|\.)(?:conv1d|conv|short_conv)\.weight$",
        "a causal convolution over the tokens (the short convolution of a state-space, linear-attention or LFM2 block)",
        "it mixes earlier tokens through input-dependent gates, and specbound derives neither its matrices as terms of "
        "the bound nor a Lipschitz factor over sequences for it",
        True,
        _NO_SPEC,
    ),
    (
        r"(?:^|\.)(?:q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj)\.weight$",
        "a multi-head latent attention projection (DeepSeek-V3's q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj)",
        "queries, keys and values pass through shared low-rank latents with an RMSNorm between (q_a_layernorm, "
        "kv_a_layernorm) and one rotary key shared by every head, not the q, k and v roles a draft names",
        False,
        _BY_HAND,
    ),
    (
        r"(?:^|\.)sinks$",
        "attention sinks (a learned logit per head in the softmax's denominator, as in gpt-oss)",
        "a draft has no term for the sink logit, and ignoring it would change every attention weight",
        False,
        _BY_HAND,
    ),
    (
        r"(?:^|\.)e_score_correction_bias$",
        "a router's score-correction bias (DeepSeek-V3's e_score_correction_bias)",
        "its router picks experts by sigmoid scores corrected by the bias, with group-limited top-k and a routed "
        "scaling "
        "factor, not the softmax routing a drafted experts section assumes (docs/theory.md 3f)",
        False,
        _BY_HAND,
    ),
)


def refuse_unmodelled(ckpt: Checkpoint, stack: LayerStack) -> None:
    """Refuse, in one line naming the weight and the layers holding its kind, a layer weight of a block
    arch infer does not draft (``UNMODELLED``: linear-attention and state-space blocks, causal
    convolutions, latent attention, attention sinks, bias-corrected routers; docs/families.md)."""
    for pattern, what, why, three_d, fix in UNMODELLED:
        hits = {
            layer: sorted(
                r
                for r in rests
                if re.search(pattern, r) and (not three_d or len(ckpt.shape(stack.name(layer, r))) == 3)
            )
            for layer, rests in stack.rests.items()
        }
        layers = sorted(l for l, found in hits.items() if found)
        if layers:
            name = stack.name(layers[0], hits[layers[0]][0])
            where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {ranges(layers)}"
            raise SpecboundError(f"{name} is {what}, in {where} of {stack.L}: {why}; {fix}")


def _refuse_banks(ckpt: Checkpoint, stack: LayerStack) -> None:
    """A 3-D floating-point tensor in a layer (every expert's weights in one bank, as transformers 5
    holds Mixtral's ``experts.gate_up_proj`` in memory) is not a matrix a spec can name."""
    for rest in sorted(stack.rests[0]):
        name = stack.name(0, rest)
        if len(ckpt.shape(name)) == 3 and ckpt.dtype(name) in FLOAT_DTYPES:
            raise SpecboundError(
                f"{name} is a 3-D tensor {tuple(ckpt.shape(name))}: a bank of expert weights (one matrix per "
                f"expert along its first axis), which arch infer does not draft; write the spec by hand with the "
                f'expert\'s roles as "layout": "bank" (docs/architectures.md; gpt_oss.json, llama4_text.json), '
                f"or, for a family whose save_pretrained writes one tensor per expert (Mixtral, Qwen-MoE), run arch "
                f"infer on the saved folder"
            )


def moe_parts(ckpt: Checkpoint, stack: LayerStack, experts: ExpertStack, matrices: list[str]) -> MoEParts:
    """The parts of a mixture-of-experts layer (layer 0): each expert's feed-forward roles, the router
    (a weight named like a gate or router with one axis of length ``E``), the shared expert (under
    ``shared_expert``) and its gate (a ``(1, N)`` weight named like ``shared_expert_gate``)."""

    expert_matrices = sorted(r for r in experts.rests if experts.rest(0, r) in matrices)
    roles = assign_roles(expert_matrices, part="feed_forward")
    outside = [m for m in matrices if not m.startswith(experts.path + ".")]
    shape = lambda rest: tuple(ckpt.shape(stack.name(0, rest)))  # noqa: E731
    shared_rests = [m for m in outside if re.search(_SHARED, m, re.IGNORECASE)]  # inside the shared expert
    gates = [
        m
        for m in outside
        if m not in shared_rests and "shared" in leaf(m).lower() and "gate" in leaf(m).lower() and 1 in shape(m)
    ]
    routers = [
        m
        for m in outside
        if m not in shared_rests
        and m not in gates
        and re.search(_ROUTER, module_of(m), re.IGNORECASE)
        and experts.count in shape(m)
    ]
    if len(routers) != 1:
        found = ", ".join(routers) if routers else f"no weight named like a router with an axis of {experts.count}"
        raise SpecboundError(
            f"{stack.name(0, experts.path)} holds {experts.count} experts, but their router cannot be told ({found}): "
            f"the router decides which experts run, so it cannot be left out; write the spec by hand"
        )
    shared = {}
    if shared_rests:
        shared = assign_roles(sorted(shared_rests), part="feed_forward").roles
        if set(shared) != set(roles.roles):
            raise SpecboundError(
                f"the shared expert ({', '.join(sorted(shared_rests))}) and the routed experts "
                f"({', '.join(expert_matrices)}) are not the same kind of block; write the spec by hand"
            )
    return MoEParts(experts, roles, routers[0], shared, gates[0] if gates else None)


def _experts_section(
    moe: MoEParts,
    tensors: dict,
    stack: LayerStack,
    stack_rel: str,
    ckpt: Checkpoint,
    config: dict,
    sizes: "Sizes",
    keys: dict,
    draft: Draft,
) -> dict:
    """The spec's ``experts`` object (the feed-forward rules move out of ``tensors`` into it) and its
    config keys: the expert count from the weights, the experts per token from a key's name only,
    the shared expert's width from its weights."""
    layer_path = f"{stack_rel}.{LAYER_PLACEHOLDER}"
    section: dict[str, Any] = {"tensors": {}}
    for role, rest in moe.roles.roles.items():
        rule = tensors.pop(role)
        rule["name"] = f"{layer_path}.{moe.experts.path}.${{expert}}.{rest}"
        section["tensors"][role] = rule
        draft.note(
            f"expert role {role}",
            rule["name"],
            f"module name {leaf(rest)!r} in each of the {moe.experts.count} experts",
        )
    router_shape = tuple(ckpt.shape(stack.name(0, moe.router)))
    section["router"] = {
        "name": f"{layer_path}.{moe.router}",
        "layout": "linear" if router_shape[0] == moe.experts.count else "conv1d",
    }
    draft.note(
        "router",
        section["router"]["name"],
        f"stored {router_shape}: one row per expert; read and shape-checked, not analysed as a matrix",
    )
    draft.note(
        "routing",
        "gates >= 0 summing to at most 1 (softmax over the router's top-k)",
        "how the router weighs the chosen experts is code, not weights; the bounds (docs/theory.md 3f) need "
        "non-negative gates summing to at most 1 (Mixtral, Qwen-MoE) and a shared expert's gate at most 1 "
        "(a sigmoid); a router that scales its gates (a routed scaling factor) is outside them",
        verify=True,
    )
    keys["num_experts"] = _config_key(
        config, "num_experts", moe.experts.count, draft, f"the {moe.experts.count} experts of {moe.experts.path}"
    )
    top_k = next(
        (k for k in CONFIG_NAMES["experts_per_token"] if _is_int(config.get(k)) and 0 < config[k] <= moe.experts.count),
        None,
    )
    keys["experts_per_token"] = [top_k or CONFIG_NAMES["experts_per_token"][0]]
    draft.note(
        "config experts_per_token",
        keys["experts_per_token"][0],
        (
            f"{top_k} = {config[top_k]}: how many experts run per token cannot be seen in the weights"
            if top_k
            else "no usual key names the experts per token: add one"
        ),
        verify=top_k is None,
    )
    if moe.shared:
        section["shared"] = {"tensors": {}}
        for role, rest in moe.shared.items():
            section["shared"]["tensors"][role] = {
                "name": f"{layer_path}.{rest}",
                "layout": section["tensors"][role]["layout"],
            }
            if "fused" in section["tensors"][role]:
                section["shared"]["tensors"][role]["fused"] = section["tensors"][role]["fused"]
        out = tuple(ckpt.shape(stack.name(0, moe.shared["ff_out"])))
        width = _other(out, sizes.N)
        keys["shared_ff_size"] = _config_key(config, "shared_ff_size", width, draft, "the shared expert's width")
        draft.note("shared expert", ", ".join(moe.shared.values()), "always on, beside the routed experts")
        if moe.shared_gate:
            section["shared"]["gate"] = {
                "name": f"{layer_path}.{moe.shared_gate}",
                "layout": "linear" if tuple(ckpt.shape(stack.name(0, moe.shared_gate)))[0] == 1 else "conv1d",
            }
            draft.note(
                "shared expert gate",
                moe.shared_gate,
                "a (1, N) weight: its sigmoid scales the shared expert's output (at most 1)",
                verify=True,
            )
    return section


def _drafted_tensors(
    ckpt: Checkpoint,
    stack: LayerStack,
    stack_rel: str,
    roles: dict,
    assignment: RoleAssignment,
    config: dict,
    draft: Draft,
    names=None,
) -> tuple[dict, dict, dict, Sizes]:
    """``(tensors, config keys, extra spec keys, sizes)`` of one stack's roles: the roles noted, the
    sizes read from their shapes, the config keys matched to them (``names``: the keys to try), the
    layouts decided, a fused qkv's and gate/up's split guessed."""
    tensor_names = {role: stack.name(0, rest) for role, rest in roles.items()}
    shapes = {role: tuple(ckpt.shape(name)) for role, name in tensor_names.items()}
    _note_roles(assignment, shapes, stack_rel, draft)
    sizes = role_sizes(shapes, config)
    keys, extra, grouped = config_keys(config, stack.L, sizes, draft, fused_qkv="qkv" in roles, names=names)
    layouts = decide_layouts(shapes, tensor_names, sizes.N, ckpt, draft)
    tensors = {
        role: {"name": f"{stack_rel}.{LAYER_PLACEHOLDER}.{rest}", "layout": layouts[role]}
        for role, rest in roles.items()
    }
    if "qkv" in tensors:
        tensors["qkv"]["fused"] = _fused(roles["qkv"], grouped, draft)
    if "ff_gate_up" in tensors:
        tensors["ff_gate_up"]["fused"] = "concat"
        draft.note(
            "fused gate_up",
            "concat ([gate | up])",
            "the first half of the outputs is the gate (Phi-3's gate_up_proj, chunked in that order); "
            "[up | gate] cannot be told apart from shapes and gives other numbers",
            verify=True,
        )
    return tensors, keys, extra, sizes


def _note_stack(stack: LayerStack, prefix: str, ckpt: Checkpoint, draft: Draft) -> None:
    draft.note(
        "layers",
        f"{stack.path}.{LAYER_PLACEHOLDER} with L = {stack.L}",
        f"the path whose index runs 0..{stack.L - 1} over the most 2-D weights",
    )
    if prefix:
        draft.note(
            "prefix",
            f"{prefix!r} (names are also tried without it)",
            f"{prefix[:-1]!r} names the base model (model_type {ckpt.config.get('model_type')!r}, "
            f"architectures {ckpt.config.get('architectures')})",
        )
    uneven = sorted(stack.anywhere - stack.everywhere)
    if uneven:
        matrices = [
            r
            for r in uneven
            if any(len(ckpt.shape(stack.name(i, r))) == 2 for i, rests in stack.rests.items() if r in rests)
        ]
        draft.note(
            "uneven layers",
            ", ".join(uneven[:5]) + (" ..." if len(uneven) > 5 else ""),
            "not every layer has these tensors"
            + (
                f"; among them the 2-D weights {matrices}: the layers differ in structure"
                if matrices
                else " (an exporter may merge identical norms or biases into one tensor)"
            ),
            verify=bool(matrices),
        )


def _note_roles(assignment: RoleAssignment, shapes: dict, stack_rel: str, draft: Draft) -> None:
    for role, rest in assignment.roles.items():
        draft.note(
            f"role {role}",
            f"{stack_rel}.{LAYER_PLACEHOLDER}.{rest}",
            f"module name {leaf(rest)!r}; stored {shapes[role]}",
        )
    if assignment.meta_llama:
        draft.note(
            "roles w1/w2/w3",
            "ff_gate = w1, ff_up = w3, ff_out = w2",
            "Meta LLaMA's naming w2(silu(w1(x)) * w3(x))",
            verify=True,
        )
    for rest in assignment.unmatched:
        draft.note(
            f"ignored {rest}",
            "a 2-D weight in every layer that matches no role: ignored",
            "no role name fits it; if it belongs to attention or the feed-forward block, the bounds leave "
            "it out and the spec must name it",
            verify=True,
        )


def _other(shape: tuple[int, int], n: int) -> int:
    return shape[1] if shape[0] == n else shape[0]


def role_sizes(shapes: dict[str, tuple[int, int]], config: dict) -> Sizes:
    """``N`` is the width every role weight shares (``q`` is ``H d_h x N`` or ``N x H d_h``, ``ff_out``
    ``N x d_ff`` or ``d_ff x N``, ...): orientation does not matter for it.  Two candidates (no square
    weight, ``H d_h = d_ff``) are decided by config.json's hidden-size keys."""
    common = set.intersection(*(set(s) for s in shapes.values()))
    if len(common) > 1:
        common = {v for v in common if any(config.get(k) == v for k in CONFIG_NAMES["hidden_size"])}
    if len(common) != 1:
        raise SpecboundError(
            f"the role weights share no single width ({', '.join(f'{r} {s}' for r, s in shapes.items())}): the "
            f"roles were guessed wrong or the hidden size is ambiguous; write the spec by hand"
        )
    n = common.pop()
    ff_role = next(r for r in ("ff_in", "ff_up", "ff_gate_up") if r in shapes)
    d_ff = _other(shapes[ff_role], n) // (2 if ff_role == "ff_gate_up" else 1)  # a fused [gate | up]
    for role in ("ff_gate", "ff_out"):
        if role in shapes and _other(shapes[role], n) != d_ff:
            raise SpecboundError(
                f"{role} {shapes[role]} and {ff_role} {shapes[ff_role]} do not share the "
                f"feed-forward width: the roles were guessed wrong; write the spec by hand"
            )
    attention = _other(shapes["o"], n)
    kv = (_other(shapes["qkv"], n) - attention) // 2 if "qkv" in shapes else _other(shapes["k"], n)
    return Sizes(N=n, d_ff=d_ff, attention=attention, kv=kv)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def names_for_stack(stack: str) -> dict[str, tuple[str, ...]]:
    """:data:`CONFIG_NAMES` for one stack of an encoder-decoder: the keys naming the other stack left
    out, the stack's own first (``encoder_layers`` before ``num_layers`` for the encoder)."""
    other = "decoder" if stack == "encoder" else "encoder"
    return {
        field: tuple(sorted((k for k in keys if other not in k), key=lambda k: stack not in k))
        for field, keys in CONFIG_NAMES.items()
    }


def _keys_holding(config: dict, field: str, value: int, names=None) -> list[str]:
    return [k for k in (names or CONFIG_NAMES)[field] if _is_int(config.get(k)) and config[k] == value]


def _config_key(config: dict, field: str, value: int, draft: Draft, what: str, names=None) -> list[str]:
    """The config.json keys holding ``value`` for ``field``: usual names first, else any key holding
    it (verify), else the usual name to add (verify)."""
    names = names or CONFIG_NAMES
    usual = _keys_holding(config, field, value, names)
    if usual:
        draft.note(f"config {field}", " or ".join(usual), f"{usual[0]} = {value} in config.json is {what}")
        return usual
    other = sorted(k for k, v in config.items() if _is_int(v) and v == value)
    if other:
        draft.note(
            f"config {field}",
            other[0],
            f"{other[0]} = {value} in config.json matches {what}, but it is not a usual name for it",
            verify=True,
        )
        return other[:1]
    name = names[field][0]
    draft.note(
        f"config {field}",
        name,
        f"no config.json key holds {value} ({what}): add {name} = {value} to config.json",
        verify=True,
    )
    return [name]


def config_keys(
    config: dict, L: int, sizes: Sizes, draft: Draft, fused_qkv: bool = False, names=None
) -> tuple[dict, dict, bool]:
    """The spec's ``config`` section, any extra spec keys (``ff_size_multiplier``), and whether there
    are fewer key/value heads than query heads.  A fused qkv maps no ``num_kv_heads`` key: the analysis
    reads ``H_kv`` from its width (Falcon's config keeps ``num_kv_heads`` where ``multi_query`` means 1).
    ``names``: the keys to try (default :data:`CONFIG_NAMES`; one stack's, for an encoder-decoder)."""
    names = names or CONFIG_NAMES
    keys = {
        "num_layers": _config_key(config, "num_layers", L, draft, "the number of layers in the stack", names),
        "hidden_size": _config_key(config, "hidden_size", sizes.N, draft, "the width all role weights share", names),
    }
    heads = next(
        (
            config[k]
            for k in names["num_heads"]
            if _is_int(config.get(k)) and config[k] > 0 and sizes.attention % config[k] == 0
        ),
        None,
    )
    if heads:
        keys["num_heads"] = _keys_holding(config, "num_heads", heads, names)[:1]
        draft.note(
            "config num_heads",
            keys["num_heads"][0],
            f"{keys['num_heads'][0]} = {heads} divides the attention width {sizes.attention}; the number of "
            f"heads cannot be seen in the weights, only in config.json",
        )
    else:
        keys["num_heads"] = [names["num_heads"][0]]
        draft.note(
            "config num_heads",
            keys["num_heads"][0],
            f"no usual heads key in config.json divides the attention width {sizes.attention}: add one",
            verify=True,
        )
    keys["ff_size"], extra = _ff_size(config, sizes, draft, names)
    heads_kv = None
    if heads:
        d_head = sizes.attention // heads
        heads_kv = sizes.kv // d_head if sizes.kv % d_head == 0 else None
        if fused_qkv and heads_kv is not None:
            draft.note(
                "config num_kv_heads",
                f"{heads_kv} from the fused qkv's width",
                f"(H + 2 H_kv) d_h = {sizes.attention + 2 * sizes.kv}; read from the weight at analysis",
            )
        elif heads_kv is not None and (heads_kv != heads or _keys_holding(config, "num_kv_heads", heads_kv, names)):
            keys["num_kv_heads"] = _config_key(
                config, "num_kv_heads", heads_kv, draft, f"the key/value width {sizes.kv} / d_head {d_head}", names
            )
        if sizes.attention != sizes.N or _keys_holding(config, "head_dim", d_head, names):
            keys["head_dim"] = _config_key(
                config, "head_dim", d_head, draft, f"the attention width {sizes.attention} / {heads} heads", names
            )
    activation = next((k for k in names["activation"] if isinstance(config.get(k), str)), None)
    if activation:
        keys["activation"] = [activation]
        draft.note("config activation", activation, f"{activation} = {config[activation]!r} sets L_phi")
    else:
        draft.note(
            "config activation",
            "none",
            "no activation key in config.json: L_phi takes the GELU default 1.13 (or pass --l-phi)",
            verify=True,
        )
    return keys, extra, heads_kv is not None and heads_kv != heads


def _ff_size(config: dict, sizes: Sizes, draft: Draft, names=None) -> tuple[list[str], dict]:
    """The feed-forward width's key; a width left implicit (GPT-2's ``n_inner = null``, BLOOM's fixed
    ``4 N``) becomes ``ff_size_multiplier`` when it is a multiple of ``N``."""
    names = names or CONFIG_NAMES
    if sizes.d_ff % sizes.N or any(_is_int(v) and v == sizes.d_ff for v in config.values()):
        return _config_key(config, "ff_size", sizes.d_ff, draft, "the feed-forward width", names), {}
    factor = sizes.d_ff // sizes.N
    null = [k for k in names["ff_size"] if k in config and config[k] is None]
    key = (null or [names["ff_size"][0]])[0]
    draft.note(
        "config ff_size",
        f"{key} -> ff_size_multiplier {factor}",
        f"no config.json key holds the feed-forward width {sizes.d_ff} = {factor} N; "
        + (f"{key} is null" if null else f"{key} is absent")
        + f", so d_ff = {factor} * hidden size",
        verify=not null,
    )
    return [key], {"ff_size_multiplier": factor}


def _layout(role: str, shape: tuple[int, int], n: int) -> str | None:
    """``linear`` or ``conv1d`` when the shape decides it; None for a square weight.  q/k/v/qkv and
    ff_in/ff_gate/ff_up read N-wide rows, o and ff_out write them: Linear stores ``(out, in)``."""
    if shape[0] == shape[1]:
        return None
    n_axis = 0 if role in ("o", "ff_out") else 1
    return "linear" if shape[n_axis] == n else "conv1d"


def decide_layouts(
    shapes: dict[str, tuple[int, int]], names: dict[str, str], n: int, ckpt: Checkpoint, draft: Draft
) -> dict[str, str]:
    """Each role's layout: its own shape's when non-square; else the non-square roles' when they agree,
    else ``linear`` (both marked verify).  Weights whose orientation the format fixes (ONNX) reveal
    nothing about how the PyTorch model stores them."""
    fixed = [r for r in shapes if ckpt.layout(names[r]) is not None]
    layouts = dict.fromkeys(fixed, "linear")
    if fixed:
        draft.note(
            f"layout {', '.join(fixed)}",
            "linear",
            "the ONNX graph fixes each weight's orientation through its MatMul/Gemm node, which wins over "
            "the spec's layout, so this source's analysis does not depend on it; how the PyTorch model "
            "stores them (nn.Linear or Conv1D) cannot be seen here: check it before using the spec on a "
            "PyTorch checkpoint",
            verify=True,
        )
    free = {r: s for r, s in shapes.items() if r not in fixed}
    known = {r: _layout(r, s, n) for r, s in free.items()}
    seen = sorted({v for v in known.values() if v})
    for layout in seen:
        decided = [r for r in free if known[r] == layout]
        layouts.update(dict.fromkeys(decided, layout))
        draft.note(
            f"layout {', '.join(decided)}",
            layout,
            f"non-square {', '.join(f'{r} {free[r]}' for r in decided)} with N = {n}: {_STORAGE[layout]}",
        )
    square = [r for r in free if known[r] is None]
    if square:
        if len(seen) == 1:
            layout, why = seen[0], "taken from the non-square weights of the same layer"
        else:
            layout = "linear"
            why = (
                "the non-square weights disagree" if seen else "no weight of the layer is non-square"
            ) + "; nn.Linear (out, in) assumed"
        layouts.update(dict.fromkeys(square, layout))
        sides = ", ".join(f"{a} x {a}" for a in sorted({free[r][0] for r in square}))
        draft.note(
            f"layout {', '.join(square)}",
            layout,
            f"square {sides}: A SQUARE MATRIX CANNOT REVEAL ITS "
            f"ORIENTATION; {why}. Check the module class: nn.Linear stores (out, in), GPT-2's Conv1D "
            f"(in, out)",
            verify=True,
        )
    return layouts


def _fused(rest: str, grouped: bool, draft: Draft) -> str:
    """For a module named ``query_key_value``: ``per_head`` with as many key/value heads as query heads
    (GPT-NeoX, BLOOM), ``per_group`` with fewer (Falcon); else ``concat``; always marked verify."""
    named = leaf(rest).lower() == "query_key_value"
    if named and not grouped:
        choice, why = "per_head", "'query_key_value' is GPT-NeoX's and BLOOM's name for [h0: q k v | h1: q k v | ...]"
    elif named:
        choice, why = (
            "per_group",
            (
                "'query_key_value' with fewer key/value heads than query heads is Falcon's "
                "[g0: q.. k v | g1: q.. k v | ...]"
            ),
        )
    elif grouped:
        choice, why = "concat", "fewer key/value heads than query heads rule out per_head; [q | k | v] assumed"
    else:
        choice, why = "concat", "[q | k | v] (GPT-2's c_attn) is the common split"
    draft.note(
        "fused qkv", choice, why + "; concat, per_head and per_group cannot be told apart from shapes", verify=True
    )
    return choice


def _block(config: dict, stack: LayerStack, draft: Draft) -> dict[str, Any]:
    """``block`` (and ``block_switch``): parallel when a boolean ``*parallel*`` config key says so, or
    when every layer has a single normalisation (attention and feed-forward then read the same
    normalised input, as in GPT-J); sequential otherwise.  Always marked verify."""
    flags = sorted(k for k, v in config.items() if isinstance(v, bool) and "parallel" in k.lower())
    if flags:
        key = flags[0]
        draft.note(
            "block",
            f"parallel when {key} is true (now {config[key]})",
            f"config.json's boolean {key}; a parallel block cannot be seen in the weights",
            verify=True,
        )
        return {
            "block": "parallel" if config[key] else "sequential",
            "block_switch": {
                "config_key": key,
                "default": config[key],
                "if_true": "parallel",
                "if_false": "sequential",
            },
        }
    if norms_per_layer(stack) == 1 and stack.everywhere == stack.anywhere:
        draft.note(
            "block",
            "parallel (attention + feed-forward on the same input)",
            "every layer has a single normalisation, so attention and feed-forward read the same "
            "normalised input (GPT-J style); the weights cannot prove it",
            verify=True,
        )
        return {"block": "parallel"}
    draft.note(
        "block",
        "sequential (attention, then feed-forward)",
        "no parallel-residual key in config.json and more than one normalisation per layer; a parallel "
        "block cannot be seen in the weights",
        verify=True,
    )
    return {"block": "sequential"}


# config.json keys that only rotary position embeddings have (HF names across families)
ROTARY_KEYS = (
    "rope_theta",
    "rotary_emb_base",
    "rotary_pct",
    "partial_rotary_factor",
    "rope_scaling",
    "rotary_dim",
    "rope_parameters",
)


def _positions(config: dict, draft: Draft) -> dict[str, Any]:
    """``rotary`` when config.json has a rotary setting: pairs as HF's ``rotate_half`` (LLaMA, NeoX),
    or interleaved for a GPT-J / CodeGen class; which pairs cannot be told from the weights, hence
    verify.  A boolean ``alibi`` key (Falcon) switches rotary off when true and marks ALiBi."""
    keys = [k for k in ROTARY_KEYS if k in config]
    alibi = isinstance(config.get("alibi"), bool)
    out: dict[str, Any] = {"alibi": "alibi"} if alibi else {}
    if alibi:
        draft.note(
            "positions",
            f"ALiBi when alibi is true (now {config['alibi']})",
            "config.json's boolean alibi: position biases on the logits, no change to any matrix",
        )
    if not keys:
        if not alibi:
            draft.note(
                "rotary",
                "none",
                "no rotary setting in config.json (learned or absolute positions assumed)",
                verify=True,
            )
        return out
    classes = " ".join(str(a) for a in config.get("architectures") or [])
    interleaved = any(name in classes for name in ("GPTJ", "CodeGen"))
    draft.note(
        "rotary",
        "interleaved (dims 2i and 2i + 1 rotate together)"
        if interleaved
        else "half (dims i and i + rot/2 rotate together, HF rotate_half)",
        f"config.json has {', '.join(keys)}"
        + (
            f"; {classes} rotates every two dimensions"
            if interleaved
            else '; interleaved pairs (GPT-J, llama.cpp) look the same in the weights: set "pairing": '
            '"interleaved" for those'
        ),
        verify=True,
    )
    out["rotary"] = {"pairing": "interleaved" if interleaved else "half", **({"off_when": "alibi"} if alibi else {})}
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_type") == "axial":  # a vision tower's 2D rotary
        draft.note(
            "rotary grid",
            "missing: rope_type 'axial' rotates each pair with a patch's row or column",
            'add a "grid" rule to "rotary" (its frequencies, axes and largest grid, docs/rotary.md 9) or '
            "start from a shipped vision family (pixtral_vision, qwen2_vl_vision, ...); without it the 1D "
            "reading refuses the axial rope type",
            verify=True,
        )
    return out


def _disentangled(config: dict, draft: Draft) -> dict[str, Any]:
    """``position_terms`` when config.json has DeBERTa-v2/v3's disentangled-attention keys: the
    content-to-position and position-to-content terms reuse each head's QK on the relative position
    embeddings and enter Lambda and gamma* (docs/theory.md 3h).  The weights cannot show them, and a
    draft without them would analyse the attention as a plain one (its factors too small)."""
    if "pos_att_type" not in config or "relative_attention" not in config:
        return {}
    draft.note(
        "position terms",
        f"disentangled attention: pos_att_type={config['pos_att_type']!r} when "
        f"relative_attention (now {config['relative_attention']})",
        "config.json's pos_att_type and relative_attention (DeBERTa-v2/v3): each term reuses the head's QK "
        "against the normalised relative embeddings, which needs share_att_key and norm_rel_ebd layer_norm "
        "(checked when analysed)",
        verify=True,
    )
    return {
        "position_terms": {
            "config_key": "pos_att_type",
            "enabled_by": "relative_attention",
            "requires": {"share_att_key": True, "norm_rel_ebd": "layer_norm"},
        }
    }


# A per-layer 1-D weight normalising the queries or the keys (Qwen3, Gemma 3, OLMo2: q_norm / k_norm;
# Persimmon, StableLM: q_layernorm / k_layernorm; Cohere: q_norm with a LayerNorm).  It changes the
# logit, so it is drafted (an RMSNorm gain) or refused, never ignored.
_QK_NORM_LEAF = {
    "q": re.compile(r"^(?:q_norm|q_layernorm|query_norm|query_layernorm|q_ln|norm_q)$", re.IGNORECASE),
    "k": re.compile(r"^(?:k_norm|k_layernorm|key_norm|key_layernorm|k_ln|norm_k)$", re.IGNORECASE),
}
EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "layernorm_epsilon")


def _qk_norm(
    ckpt: Checkpoint, stack: LayerStack, prefix: str, config: dict, sizes: Sizes, keys: dict, draft: Draft
) -> tuple[dict[str, Any], set[str]]:
    """``{"qk_norm": ...}`` and the layer-relative names it covers, when every layer has a query and
    a key norm gain; a norm that cannot be drafted (a bias, i.e. a LayerNorm; a size that is neither
    a head nor the projection; one of the pair only) is a one-line error naming the weight."""
    found: dict[str, list[str]] = {"q": [], "k": []}
    for rest in sorted(stack.anywhere):
        module, _, param = rest.rpartition(".")
        for which, pattern in _QK_NORM_LEAF.items():
            if pattern.match(module.rsplit(".", 1)[-1]):
                found[which].append(rest)
    if not found["q"] and not found["k"]:
        return {}, set()
    names = [stack.name(0, r) for r in found["q"] + found["k"]]
    where = f"{ckpt.location}: {', '.join(names)}"
    biases = [r for r in found["q"] + found["k"] if not r.endswith(".weight")]
    if biases:
        raise SpecboundError(
            f"{where} normalise queries and keys with a bias ({stack.name(0, biases[0])}): a LayerNorm "
            f"on q/k changes the logit and is not supported (only an RMSNorm gain); write the spec "
            f"by hand for a family without it, or analyse another checkpoint"
        )
    if len(found["q"]) != 1 or len(found["k"]) != 1 or not {found["q"][0], found["k"][0]} <= stack.everywhere:
        raise SpecboundError(
            f"{where}: a query/key normalisation must be one q and one k gain in every layer, found "
            f"q {found['q']} and k {found['k']}; it changes the logit, so it cannot be ignored: "
            f"write the spec by hand (docs/architectures.md, qk_norm)"
        )
    heads_key = keys["num_heads"][0]
    heads = config.get(heads_key)
    d_head = sizes.attention // heads if _is_int(heads) and heads > 0 else None
    shapes = {w: tuple(ckpt.shape(stack.name(0, found[w][0]))) for w in "qk"}
    if d_head and shapes == {"q": (d_head,), "k": (d_head,)}:
        span = "head"
    elif shapes == {"q": (sizes.attention,), "k": (sizes.kv,)}:
        span = "all_heads"
    else:
        raise SpecboundError(
            f"{where} have shapes q {shapes['q']} and k {shapes['k']}, neither one head's d_head = "
            f"{d_head} features nor the projections' ({sizes.attention},) and ({sizes.kv},): they "
            f"normalise something else; write the spec by hand"
        )
    names_of_model = [str(config.get("model_type", ""))] + [str(a) for a in config.get("architectures") or []]
    gemma = any(n.lower().startswith("gemma") for n in names_of_model)
    eps = [k for k in EPS_KEYS if isinstance(config.get(k), (int, float)) and not isinstance(config.get(k), bool)]
    stack_rel = stack.path[len(prefix) :]
    rule = {
        "q": f"{stack_rel}.{LAYER_PLACEHOLDER}.{found['q'][0]}",
        "k": f"{stack_rel}.{LAYER_PLACEHOLDER}.{found['k'][0]}",
        "span": span,
        "gain": "one_plus_weight" if gemma else "weight",
        "eps": eps[:1] or [EPS_KEYS[0]],
    }
    draft.note(
        "qk_norm",
        f"RMSNorm on queries and keys over {'each head' if span == 'head' else 'the whole projection'}"
        f" ({found['q'][0]}, {found['k'][0]})",
        f"1-D weights of {shapes['q'][0]} and {shapes['k'][0]} features in every layer; they change the logit "
        f"(docs/theory.md 3d), so they are part of the bound, not ignored",
    )
    draft.note(
        "qk_norm gain",
        "1 + w (Gemma's RMSNorm)" if gemma else "w",
        "whether the norm multiplies by w or by 1 + w cannot be seen in the weights"
        + (" (a Gemma model_type or architecture: 1 + w)" if gemma else ""),
        verify=True,
    )
    draft.note(
        "qk_norm eps",
        rule["eps"][0],
        f"{rule['eps'][0]} = {config.get(rule['eps'][0])!r} in config.json"
        if eps
        else f"no epsilon key in config.json: add {EPS_KEYS[0]}",
        verify=not eps,
    )
    return {"qk_norm": rule}, {found["q"][0], found["k"][0]}


def _note_ignored(patterns: list[str], in_layer: list[str], stack_rel: str, draft: Draft) -> None:
    outside = [p for p in patterns if not p.startswith("^" + stack_rel.replace(".", "\\."))]
    shown = ", ".join(in_layer[:4]) + (" ..." if len(in_layer) > 4 else "")
    draft.note(
        "ignore",
        f"{', '.join(outside)}; per layer: {shown or 'nothing else'}",
        "biases, norms, embeddings and heads are not part of the bounds (as in the paper's experiment); a "
        "query/key norm is not ignored (qk_norm)",
    )


def self_check(spec: dict, ckpt: Checkpoint) -> str:
    """``analyze``'s accounting on the draft: ``"ok: ..."`` or ``"FAILS: <the error>"``."""
    try:
        parsed = parse_spec(spec, "the drafted spec")
        if parsed.towers is not None:
            found = [(t.name, bind(tower_spec(t, view.config), view)[0]) for t, view in tower_views(parsed, ckpt, None)]
        elif parsed.stacks is not None:
            dims = bind(parsed, ckpt)[0]
            found = [(part.name, part.dims) for part in dims.stacks]
        else:
            dims = model_dims(parsed, ckpt.config)
            prefix = detect_prefix(parsed, ckpt)
            dims = infer_kv_heads(parsed, ckpt, dims, prefix)
            account_for_tensors(parsed, ckpt, dims, prefix)
            found = [(None, dims)]
    except SpecboundError as exc:
        return f"FAILS: {exc}"
    shapes = "; ".join(
        (f"{name}: " if name else "") + f"L={d.L}, N={d.N}, heads={d.H}, kv heads={d.H_kv}, "
        f"d_head={d.d_head}, d_ff={d.d_ff}"
        for name, d in found
    )
    return f"ok: every tensor is a role weight or ignored, and the shapes match config.json ({shapes})"


# --- two chains: an encoder-decoder, or a two-tower model ----------------------------------------


def two_chains(stacks: list[LayerStack], config: dict) -> tuple[str, list[LayerStack]] | None:
    """``("stacks", [encoder, decoder])`` when the two top-level layer stacks holding the most weights
    are an encoder's and a decoder's (a path component ``encoder`` / ``decoder``), ``("towers", [text,
    vision])`` when they are a text and a vision tower (first components naming ``text`` and
    ``vision``, config.json's ``text_config`` and ``vision_config``); None otherwise (one chain)."""
    if len(stacks) < 2:
        return None
    a, b = stacks[0], stacks[1]

    def where(stack: LayerStack, word: str) -> bool:
        return word in stack.path.lower().split(".")

    for enc, dec in ((a, b), (b, a)):
        if where(enc, "encoder") and where(dec, "decoder") and not where(enc, "decoder"):
            return "stacks", [enc, dec]
    first = lambda s: s.path.split(".")[0].lower()  # noqa: E731
    if isinstance(config.get("text_config"), dict) and isinstance(config.get("vision_config"), dict):
        for text, vision in ((a, b), (b, a)):
            if "text" in first(text) and "vision" in first(vision):
                return "towers", [text, vision]
    return None


@dataclass
class _Chain:
    """One stack's part of a draft: its tensors, config keys, extra keys, feed-forward form, the
    layer-relative weights it uses (for the ignore patterns)."""

    tensors: dict
    config: dict
    extra: dict
    feed_forward: str
    role_rests: set


def _draft_chain(
    ckpt: Checkpoint,
    stack: LayerStack,
    prefix: str,
    config: dict,
    draft: Draft,
    label: str,
    names=None,
    *,
    cross: bool = False,
) -> _Chain:
    """Roles, layouts and config keys of one stack (``label`` heads its notes; ``cross``: a decoder,
    whose cross-attention block is drafted as ``q_cross`` ... ``o_cross``)."""
    sub = Draft()
    matrices = sorted(
        r
        for r in stack.rests[0]
        if len(ckpt.shape(stack.name(0, r))) == 2 and ckpt.dtype(stack.name(0, r)) in FLOAT_DTYPES
    )
    cross_rests = [r for r in matrices if is_cross_attention(r)]
    if cross and not cross_rests:
        try:
            assign_roles(matrices)
        except SpecboundError as exc:  # a second attention block under another name: say which weights
            raise SpecboundError(
                f"{ckpt.location}: the decoder stack {stack.path} has no block named as a "
                f"cross-attention (encoder_attn, EncDecAttention, crossattention, ...): {exc}"
            ) from None
        raise SpecboundError(
            f"{ckpt.location}: the decoder stack {stack.path} holds no cross-attention block (a "
            f"second attention reading the encoder's output, e.g. encoder_attn, EncDecAttention) in "
            f"layer 0, so this encoder-decoder cannot be drafted; write the spec by hand"
        )
    if not cross and cross_rests:
        raise SpecboundError(
            f"{ckpt.location}: the stack {stack.path} holds a cross-attention block "
            f"({', '.join(cross_rests)}) but is not a decoder; write the spec by hand"
        )
    assignment = assign_roles([r for r in matrices if r not in cross_rests])
    roles = dict(assignment.roles)
    cross_roles = assign_attention_roles(cross_rests) if cross else {}
    if "qkv" in cross_roles:
        raise SpecboundError(
            f"{ckpt.location}: a fused cross-attention weight ({cross_roles['qkv']}) is not "
            f"supported; write the spec by hand"
        )
    stack_rel = stack.path[len(prefix) :]
    tensors, keys, extra, sizes = _drafted_tensors(ckpt, stack, stack_rel, roles, assignment, config, sub, names)
    if cross_roles:
        cross_names = {role: stack.name(0, rest) for role, rest in cross_roles.items()}
        cross_shapes = {role: tuple(ckpt.shape(n)) for role, n in cross_names.items()}
        layout_notes = Draft()
        cross_layouts = decide_layouts(cross_shapes, cross_names, sizes.N, ckpt, layout_notes)
        for g in layout_notes.guesses:  # the cross-attention's roles named as such
            topic = "layout " + ", ".join(f"{r}_cross" for r in g.topic[len("layout ") :].split(", "))
            sub.note(topic, g.choice, g.evidence, g.verify)
        for role, rest in cross_roles.items():
            sub.note(
                f"role {role}_cross",
                f"{stack_rel}.{LAYER_PLACEHOLDER}.{rest}",
                f"module {module_of(rest)!r} is a cross-attention (its keys and values read the encoder's "
                f"output); stored {cross_shapes[role]}",
            )
            tensors[role + "_cross"] = {
                "name": f"{stack_rel}.{LAYER_PLACEHOLDER}.{rest}",
                "layout": cross_layouts[role],
            }
    for g in sub.guesses:
        draft.note(f"{label} {g.topic}", g.choice, g.evidence, g.verify)
    return _Chain(
        tensors,
        keys,
        extra,
        "gated" if {"ff_gate", "ff_gate_up"} & set(roles) else "plain",
        set(roles.values()) | set(cross_roles.values()),
    )


def _infer_two(ckpt: Checkpoint, draft: Draft, model_type: str, shape: str, stacks: list[LayerStack]) -> Draft:
    """The draft of an encoder-decoder (``shape = "stacks"``) or a two-tower model (``"towers"``)."""
    config = ckpt.config
    if any(k in config for k in ROTARY_KEYS):
        raise SpecboundError(
            f"{ckpt.location}: config.json has rotary settings ({', '.join(k for k in ROTARY_KEYS if k in config)}), "
            f"which specbound does not model with two chains; write the spec by hand"
        )
    base = {
        "family": model_type,
        "description": f"drafted by `specbound arch infer` from {ckpt.location}; verify before trusting it",
        "model_types": [model_type],
    }
    if shape == "stacks":
        prefix = wrapper_prefix(stacks[0].path, config)
        for stack, name in zip(stacks, ("encoder", "decoder")):
            inner = re.search(r"\.\d+\.", stack.path)
            if inner:  # e.g. decoder.block.0.layer: block 0's sub-blocks, under a stack of one layer
                raise SpecboundError(
                    f"{ckpt.location}: the {name} stack found is {stack.path}, the sub-blocks of "
                    f"layer {inner.group()[1:-1]} of {stack.path[: inner.start()]}: a stack of one "
                    f"layer cannot be told from a wrapper around one; write the spec by hand "
                    f"(docs/architectures.md)"
                )
            draft.note(
                f"{name} layers",
                f"{stack.path}.{LAYER_PLACEHOLDER} with L = {stack.L}",
                f"a top-level stack named {name}"
                + ("; its layers hold a cross-attention" if name == "decoder" else ""),
            )
        parts = [
            _draft_chain(ckpt, stack, prefix, config, draft, name, names_for_stack(name), cross=name == "decoder")
            for stack, name in zip(stacks, ("encoder", "decoder"))
        ]
        if parts[0].feed_forward != parts[1].feed_forward or parts[0].extra or parts[1].extra:
            raise SpecboundError(
                f"{ckpt.location}: the encoder's and decoder's feed-forward blocks differ "
                f"({parts[0].feed_forward}, {parts[1].feed_forward}) or their width is implicit; "
                f"write the spec by hand"
            )
        patterns, in_layer = stacks_ignore_patterns(
            ckpt.names, [(s, p.role_rests) for s, p in zip(stacks, parts)], prefix
        )
        _note_ignored(patterns, in_layer, stacks[0].path[len(prefix) :], draft)
        draft.note(
            "block",
            "sequential (self-attention, cross-attention in the decoder, then feed-forward)",
            "an encoder-decoder's blocks; a parallel block cannot be seen in the weights",
            verify=True,
        )
        draft.spec = {
            **base,
            "prefixes": ["", prefix] if prefix else [""],
            "config": {},
            "block": "sequential",
            "feed_forward": parts[0].feed_forward,
            "stacks": {
                name: {"config": p.config, "tensors": p.tensors} for name, p in zip(("encoder", "decoder"), parts)
            },
            "ignore": patterns,
        }
    else:
        towers = {}
        inside = []
        for stack, name in zip(stacks, ("text", "vision")):
            prefix = stack.path.split(".")[0] + "."
            draft.note(
                f"{name} tower",
                f"{stack.path}.{LAYER_PLACEHOLDER} with L = {stack.L}, config {name}_config",
                f"the first component {prefix[:-1]!r} names the {name} tower; config.json has {name}_config",
            )
            sub_config = config[f"{name}_config"]
            part = _draft_chain(ckpt, stack, prefix, sub_config, draft, name)
            own = [n for n in ckpt.names if n.startswith(prefix)]
            inside += own
            patterns, _ = ignore_patterns(own, stack, prefix, part.role_rests)  # relative to the tower's prefix
            towers[name] = {
                "config_section": [f"{name}_config"],
                "prefixes": [prefix],
                "config": part.config,
                "feed_forward": part.feed_forward,
                **part.extra,
                "tensors": part.tensors,
                "ignore": patterns,
            }
        outside = sorted({_outside_pattern(n) for n in ckpt.names if n not in set(inside)})
        draft.note(
            "ignore (shared)",
            ", ".join(outside) or "nothing",
            "outside both towers: projection heads, the logit scale (outside the bound, like a classifier head)",
        )
        draft.spec = {
            **base,
            "block": "sequential",
            "feed_forward": towers["text"]["feed_forward"],
            "towers": towers,
            "ignore": outside,
        }
        for tower in towers.values():
            if "ff_size_multiplier" in tower:
                raise SpecboundError(
                    f"{ckpt.location}: a tower's feed-forward width is implicit in config.json; write the spec by hand"
                )
    parse_spec(draft.spec, "the drafted spec")  # an invalid draft is a bug here, not the user's problem
    draft.check = self_check(draft.spec, ckpt)
    return draft


def _outside_pattern(name: str) -> str:
    r"""``^first\.`` (or ``^name$``) for a tensor outside every tower."""
    first, _, rest = name.partition(".")
    return f"^{re.escape(first)}" + ("\\." if rest else "$")


# --- a vision-language wrapper: each tower a shipped family, named -----------------------------------------------

_TOWER_WORDS = {"text": ("language", "text", "llm"), "vision": ("vision", "visual", "image")}


def _infer_wrapper(ckpt: Checkpoint, draft: Draft, model_type: str) -> Draft | None:
    """A wrapper whose ``text_config`` (and ``vision_config``) name shipped families: a spec whose towers
    reference them (docs/architectures.md), each under the prefix where the checkpoint holds that family's
    layer-0 query weight, the tensors outside every tower drafted as the projector; None when no shipped
    family reads the text model (the one-chain draft then reads its tensor names)."""
    # a section's model type that a shipped wrapper's tower reads as a family of another name (idefics3_vision)
    aliases = {
        t: tower.family
        for spec in builtin_specs().values()
        for tower in spec.towers or ()
        if tower.family is not None
        for t in tower.model_types
    }
    config, towers, inside, notes = ckpt.config, {}, [], len(draft.guesses)
    for name in ("text", "vision"):
        section = config.get(f"{name}_config")
        if not isinstance(section, dict):
            continue
        model_type = str(section.get("model_type"))
        try:
            family = referenced_family(
                aliases.get(model_type, model_type), by_model_type=model_type not in aliases, what=""
            )
        except SpecboundError:
            draft.note(
                f"{name} tower",
                "left out",
                f"{name}_config has model_type {section.get('model_type')!r}, "
                f"which no shipped family reads: its tensors are drafted as outside the towers",
                verify=True,
            )
            continue
        probe = family.tensors["qkv" if "qkv" in family.tensors else "o" if family.latent else "q"].name_for(0)
        found = sorted(
            {n[: -len(probe)] for n in ckpt.names if n.endswith(probe) and (n == probe or n[-len(probe) - 1] == ".")}
        )
        marked = [p for p in found if any(w in p.lower() for w in _TOWER_WORDS[name])]
        if not marked:  # Qwen2.5-VL's text model saved under model.: the prefix naming no other tower
            other = _TOWER_WORDS["vision" if name == "text" else "text"]
            marked = [p for p in found if not any(w in p.lower() for w in other)]
        if len(marked) != 1:
            raise SpecboundError(
                f"{ckpt.location}: {name}_config is the {family.family} family, but its layer-0 "
                f"query weight ({probe}) sits under {len(marked)} prefixes naming a {name} model "
                f"({', '.join(marked) or 'none'}); write the spec by hand (docs/architectures.md)"
            )
        prefix = marked[0]
        reference = family.family if family.tower is None else f"{family.family}.{family.tower}"
        draft.note(
            f"{name} tower",
            f"the {reference} family under {prefix!r}",
            f"{name}_config has model_type {section.get('model_type')!r}; {prefix}{probe} is its layer-0 query weight",
        )
        towers[name] = {
            "family": reference,
            "config_section": [f"{name}_config"],
            "prefixes": [prefix],
            **({"model_types": [model_type]} if model_type in aliases else {}),
        }
        inside.append(prefix)
    if "text" not in towers:  # drafted as one chain instead, from the tensor names
        del draft.guesses[notes:]
        return None
    head = ["^lm_head\\.", "^(model\\.)?language_model\\.lm_head\\."]
    outside = sorted(
        {
            _projector_prefix(n)
            for n in ckpt.names
            if not any(n.startswith(p) for p in inside) and not any(re.search(h, n) for h in head)
        }
    )
    draft.note(
        "projector",
        ", ".join(outside) or "nothing",
        "the tensors outside every tower: what maps the vision tower's output into the text tower's input, "
        "outside both bounds; describe what it computes",
        verify=True,
    )
    draft.spec = {
        "family": model_type,
        "description": f"drafted by `specbound arch infer` from {ckpt.location}; verify before trusting it",
        "model_types": [model_type],
        "towers": towers,
        "projector": {"prefixes": outside, "description": "drafted: the tensors outside every tower"},
        "ignore": head,
    }
    parse_spec(draft.spec, "the drafted spec")  # an invalid draft is a bug here, not the user's problem
    draft.check = self_check(draft.spec, ckpt)
    return draft


def _projector_prefix(name: str) -> str:
    """The first component of a tensor outside every tower with its dot, the first two under ``model.``."""
    parts = name.split(".")
    keep = 2 if parts[0] == "model" and len(parts) > 2 else 1
    return ".".join(parts[:keep]) + ("." if len(parts) > keep else "")
