"""The config.json an export on its own lacks (an ONNX file without config.json), inferred from the
checkpoint: every value with the tensor or node it was read from.

* ``L``: the layer stack's index range (:func:`~.tensor_names.find_layer_stack`);
* ``N``, ``d_ff`` and the attention / key-value widths: the role weights' shapes
  (:func:`~.infer.role_sizes`, roles from the module names);
* the number of heads: the constant target shapes of the attention module's Reshape nodes
  (``[batch, seq, H, d_head]``: ``H d_head`` is the query width), else its scale constant
  (``1/sqrt(d_head)``, or ``d_head^(-1/4)`` applied to q and k);
* the activation: the ops of the feed-forward module (``Erf``: exact GELU; ``Tanh``: its tanh
  approximation; ``Sigmoid``: SiLU; ``Relu``);
* the family: the shipped spec whose layer-0 weight names the checkpoint holds (under any prefix).

A family with rotary position embeddings (LLaMA) is analysed with the bounds valid for every
rotation unless ``max_position_embeddings`` and ``rope_theta`` are given (``--set``): an export does
not keep them, and they are never guessed.

The caller's own keys (``--config FILE``, ``--set key=value``) win over every inferred one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SpecboundError
from ..io import FLOAT_DTYPES, Checkpoint
from .infer import role_sizes
from .registry import builtin_specs
from .spec import ArchSpec
from .tensor_names import assign_roles, find_layer_stack, module_of

# A feed-forward module's op -> the config's activation name (``compute.propagation``'s table).
_ACTIVATION_OPS = (
    ("Gelu:tanh", "gelu_new"),
    ("Gelu:none", "gelu"),
    ("Erf", "gelu"),
    ("Tanh", "gelu_new"),
    ("Sigmoid", "silu"),
    ("Relu", "relu"),
)
INFERRED_KEY = "specbound_inferred"  # config key: field -> "value (evidence)", for the record


@dataclass(frozen=True)
class Inferred:
    field: str
    value: Any
    evidence: str


def _layers_from_config(config: dict) -> int | None:
    value = config.get("num_hidden_layers", config.get("n_layer", config.get("n_layers")))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def family_by_names(names: list[str], config: dict) -> tuple[ArchSpec, str]:
    """The shipped family whose layer-0 role weights ``names`` holds, under any prefix; the
    config's ``model_type`` when it names one.  Several families with the same names (BERT and
    ELECTRA): the first by name, said in the evidence."""
    specs = builtin_specs()
    wanted = config.get("model_type")
    for spec in specs.values():
        if wanted in spec.model_types:
            return spec, f"model_type {wanted!r} given"

    def held(probe: str) -> bool:
        return any(n == probe or n.endswith("." + probe) for n in names)

    found = []
    for index, spec in enumerate(specs.values()):
        if not spec.tensors:  # an encoder-decoder's or two-tower family's tensors are its stacks' or towers'
            continue
        probes = _layer0_probes(spec)
        if all(any(n == p or n.endswith("." + p) for n in names) for p in probes):
            # every structural fact and a NoPE rule counts: the names cannot show them, so the plainest
            # family wins a tie (LLaMA before Cohere2, Granite, SmolLM3, which carry LLaMA's names)
            structural = len(spec.structure or {}) + ("nope" in (spec.rotary_options or {}))
            found.append((-len(probes), structural, index, spec))
    # the most specific match first (experts, query/key norms); the names cannot show a family's
    # structural facts (Gemma's (1 + w) norms, OLMo2's post-norms), so then the family with the fewest
    # of them (LLaMA before Gemma, Cohere2 or Granite, Qwen3 before OLMo2 and Gemma 3), then file order
    found = [spec for *_, spec in sorted(found, key=lambda f: f[:3])]
    if not found:
        raise SpecboundError(
            f"no shipped family's layer-0 weight names are in the checkpoint (it has e.g. {sorted(names)[:4]}); "
            f"name the family with --set model_type=NAME and the dimensions with --config FILE, or draft a spec "
            f"with `specbound arch infer SOURCE` and pass it with --arch-spec FILE"
        )
    spec = found[0]
    also = f" (also matches {', '.join(s.family for s in found[1:])}: the same tensor names)" if found[1:] else ""
    return spec, f"its layer-0 weights are named as in {spec.origin}{also}"


def _layer0_probes(spec: ArchSpec) -> list[str]:
    """The layer-0 tensor names a checkpoint of ``spec`` must hold: its role weights, its query/key
    norms, and with experts the router, expert 0's weights and the shared expert's."""
    probes = [rule.name_for(0) for rule in spec.tensors.values()]
    if spec.qk_norm is not None:
        probes += list(spec.qk_norm.names_for(0))
    if spec.experts is not None:
        e = spec.experts
        probes += [e.router.name_for(0)] + [rule.name_for(0, expert=0) for rule in e.tensors.values()]
        probes += [rule.name_for(0) for rule in (e.shared or {}).values()]
    return probes


def _heads_from_reshapes(module: str, hints, attention: int, kv: int) -> tuple[int, int | None, str] | None:
    """``(H, H_kv or None, evidence)`` from a 4-D Reshape target ``[..., h, d]`` in ``module`` with
    ``h d`` the query width (and another with ``h d`` the key/value width when they differ); ``h = -1``
    (``view(..., -1, d_head)``) reads as the query width over ``d``.  Two targets that split one
    width differently contradict each other: an error quoting both, never the first by node order."""
    splits: dict[str, dict[tuple[int, int], str]] = {"query": {}, "key/value": {}}
    for scope, entries in sorted(hints.reshapes.items()):
        if scope != module and not scope.startswith(module + "."):
            continue
        for node, target in entries:
            if len(target) != 4 or target[2] is None or target[3] is None or target[3] <= 0 or target[2] in (0, None):
                continue
            h, d = target[2], target[3]
            if h == -1 and d > 0 and attention % d == 0:  # view(..., -1, d_head): d_head is given
                h = attention // d
            width = "query" if h * d == attention else "key/value" if h * d == kv else None
            if width is not None:
                splits[width].setdefault((h, d), f"Reshape node {node!r} of {scope} has the target shape {target}")
    for width, found in splits.items():
        if len(found) > 1:
            (a, first), (b, second) = list(found.items())[:2]
            raise SpecboundError(
                f"the graph's Reshape targets contradict each other about the {width} heads: {first} ({a[0]} heads "
                f"of {a[1]}), but {second} ({b[0]} heads of {b[1]}); pass the head count (--set), or the model's "
                f"config.json"
            )
    if not splits["query"]:
        return None
    (((heads, _), evidence),) = splits["query"].items()
    kv_heads = next(iter(splits["key/value"]))[0] if splits["key/value"] and kv != attention else None
    return heads, kv_heads, evidence


# A scale constant d^(+-1/2) or d^(+-1/4) for d_head in 2..10^6 lies well inside this range; outside
# it (a mask's -1e9, an overflowing 1e300) a constant is no scale, and its powers are not computed.
_SCALE_RANGE = (1e-3, 1e3)


def _heads_from_scale(module: str, hints, attention: int) -> tuple[int, str] | None:
    """``(H, evidence)`` from a scalar Mul/Div in ``module`` equal to ``d^(-1/2)``, ``d^(1/2)``,
    ``d^(-1/4)`` or ``d^(1/4)`` for a ``d_head`` dividing the query width."""
    for scope, entries in sorted(hints.scalars.items()):
        if scope != module and not scope.startswith(module + "."):
            continue
        for node, op, value in entries:
            if not _SCALE_RANGE[0] < value < _SCALE_RANGE[1]:
                continue
            for power in (-2.0, 2.0, -4.0, 4.0):  # value = d^(1/power)
                d = value**power
                if abs(d - round(d)) < 1e-3 * d and round(d) > 1 and attention % round(d) == 0:
                    d_head = round(d)
                    return attention // d_head, (
                        f"{op} node {node!r} of {scope} scales by {value:.6g} = "
                        f"d_head^(1/{power:g}) with d_head = {d_head}"
                    )
    return None


def _activation(module: str, hints) -> tuple[str, str] | None:
    ops = [
        (node, op, scope)
        for scope, entries in sorted(hints.ops.items())
        if scope == module or scope.startswith(module + ".")
        for node, op in entries
    ]
    for pattern, name in _ACTIVATION_OPS:
        for node, op, scope in ops:
            if op == pattern:
                return name, f"{op} node {node!r} of {scope}"
    return None


def infer_config(ckpt: Checkpoint) -> tuple[dict[str, Any], list[Inferred]]:
    """The config ``ckpt`` lacks, in its family's config keys, and the evidence of each value
    (module docstring).  Keys already in ``ckpt.config`` are kept as given."""
    given = dict(ckpt.config)
    stack = find_layer_stack(ckpt, _layers_from_config(given))
    matrices = sorted(
        r
        for r in stack.rests[0]
        if len(ckpt.shape(stack.name(0, r))) == 2 and ckpt.dtype(stack.name(0, r)) in FLOAT_DTYPES
    )
    roles = assign_roles(matrices).roles
    shapes = {role: tuple(ckpt.shape(stack.name(0, rest))) for role, rest in roles.items()}
    sizes = role_sizes(shapes, given)
    spec, why = family_by_names(ckpt.names, given)
    notes = [
        Inferred("model_type", spec.model_types[0], why),
        Inferred(
            "num_layers",
            stack.L,
            f"the layer index of {stack.path}.<i> runs 0..{stack.L - 1} "
            f"(tensor {stack.name(stack.L - 1, sorted(stack.rests[stack.L - 1])[0])})",
        ),
        Inferred(
            "hidden_size",
            sizes.N,
            f"the width all layer-0 role weights share ({', '.join(f'{r} {s}' for r, s in shapes.items())})",
        ),
        Inferred(
            "ff_size",
            sizes.d_ff,
            f"the other side of {stack.name(0, roles.get('ff_in') or roles['ff_up'])} "
            f"{shapes.get('ff_in') or shapes['ff_up']}",
        ),
    ]
    hints = ckpt.facts.graph_hints
    attention_module = module_of(stack.name(0, roles.get("q") or roles["qkv"])).rsplit(".", 1)[0]
    try:
        found = _heads_from_reshapes(attention_module, hints, sizes.attention, sizes.kv) if hints else None
    except SpecboundError:
        if spec.config_value(given, "num_heads") is None:
            raise
        found = None  # contradictory targets, but the caller gave the head count (it wins anyway)
    if found:
        heads, kv_heads, evidence = found
        notes.append(Inferred("num_heads", heads, evidence))
        if kv_heads:
            notes.append(Inferred("num_kv_heads", kv_heads, evidence.replace("target shape", "key/value target")))
    else:
        scaled = _heads_from_scale(attention_module, hints, sizes.attention) if hints else None
        if scaled:
            notes.append(Inferred("num_heads", *scaled))
    if (
        sizes.kv != sizes.attention
        and not any(n.field == "num_kv_heads" for n in notes)
        and any(n.field == "num_heads" for n in notes)
    ):
        heads = next(n.value for n in notes if n.field == "num_heads")
        d_head = sizes.attention // heads
        notes.append(Inferred("num_kv_heads", sizes.kv // d_head, f"the key/value width {sizes.kv} / d_head {d_head}"))
    if any(n.field == "num_heads" for n in notes) and sizes.attention != sizes.N:
        heads = next(n.value for n in notes if n.field == "num_heads")
        notes.append(
            Inferred("head_dim", sizes.attention // heads, f"the query width {sizes.attention} / {heads} heads")
        )
    ff_module = module_of(stack.name(0, roles.get("ff_in") or roles["ff_gate"])).rsplit(".", 1)[0]
    act = _activation(ff_module, hints) if hints else None
    if act:
        notes.append(Inferred("activation", *act))
    config = {}
    for note in notes:
        key = "model_type" if note.field == "model_type" else (spec.config_keys.get(note.field) or (None,))[0]
        if key is not None:
            config[key] = note.value
    config[INFERRED_KEY] = {n.field: f"{n.value} ({n.evidence})" for n in notes}
    config.update(given)  # the caller's keys win
    if spec.rotary is not None and not any(k in given for k in ("max_position_embeddings", "n_positions")):
        notes.append(
            Inferred(
                "rotary",
                "context length not in the graph",
                "an export keeps only cos/sin tables of its own length: the bounds valid for every "
                "rotation are used; for the exact ones pass --set max_position_embeddings=N "
                "--set rope_theta=BASE from the model card",
            )
        )
        config[INFERRED_KEY]["rotary"] = f"{notes[-1].value} ({notes[-1].evidence})"
    missing = [f for f in ("num_heads",) if spec.config_value(config, f) is None]
    if missing:
        keys = spec.config_keys["num_heads"][0]
        raise SpecboundError(
            f"{ckpt.location} has no config.json and its graph does not show the number of attention heads "
            f"(no constant Reshape target or scale in {attention_module}); pass it: --set {keys}=H"
        )
    return config, notes


def complete_config(ckpt: Checkpoint) -> tuple[Checkpoint, list[Inferred]]:
    """``(ckpt, inferred)``: ``ckpt.config`` filled in place when the checkpoint came without config.json
    (``facts.needs_config``; called once, by the opener), and what was inferred (for ``arch infer``'s report;
    empty for a checkpoint with its config.json).

    When the graph cannot be read but the caller's keys (``--config FILE``) name the family, they
    are used as they are (a missing dimension is then reported by the family's own checks)."""
    if not ckpt.facts.needs_config:
        return ckpt, []
    try:
        ckpt.config, inferred = infer_config(ckpt)
    except SpecboundError:
        if not ckpt.config.get("model_type"):  # the caller's --config/--set names no family either
            raise
        return ckpt, []
    return ckpt, inferred


def describe(notes: list[Inferred]) -> str:
    """One line per inferred value, for stderr."""
    return "\n".join(f"  {n.field} = {n.value}: {n.evidence}" for n in notes)
