"""A family spec bound to one checkpoint: the model's dimensions from config.json, the tensor-name
prefix, the key/value head count when the config omits it, and every tensor accounted for (a role
weight of some layer or deliberately ignored) before any number is computed."""

from __future__ import annotations

from dataclasses import replace

from ..errors import SpecboundError
from ..io import Checkpoint
from .hybrids import refuse_ignored_recurrent
from .latent import latent_config_said, latent_dims, latent_gain_shapes, latent_rules
from .model import MixtureOfExperts, ModelDims
from .spec import BANK, ArchSpec, TensorRule


def model_dims(spec: ArchSpec, config: dict) -> ModelDims:
    def need(field: str, optional: bool = False) -> int | None:
        value = spec.config_value(config, field)
        if optional and value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            keys = " or ".join(spec.config_keys[field])
            raise SpecboundError(
                f"config.json needs a positive integer {keys} for the {spec.family} family, found {value!r}"
            )
        return value

    L, N, H = need("num_layers"), need("hidden_size"), need("num_heads")
    latent = None
    if spec.latent is not None:
        latent = latent_dims(spec, config)
    if spec.ff_size_multiplier and spec.config_value(config, "ff_size") is None:
        d_ff = spec.ff_size_multiplier * N  # e.g. GPT-2's n_inner = None means 4 * n_embd
    elif not spec.config_keys.get("ff_size", ("",)):
        d_ff = FF_SIZE_FROM_TENSORS  # read from the stored feed-forward weight (infer_from_shapes)
    else:
        d_ff = need("ff_size")
    head_dim = latent.d_v if latent is not None else need("head_dim", optional=True)
    d_head = head_dim or (N // H)
    if not head_dim and N % H:
        raise SpecboundError(
            f"config.json: hidden_size={N} is not divisible by num_heads={H}, so the "
            f"head size is undefined: fix the config to match the saved model"
        )
    H_kv = need("num_kv_heads", optional=True) or H
    if H % H_kv:
        raise SpecboundError(f"config.json: {H} query heads cannot share {H_kv} key/value heads evenly")
    activation = spec.config_value(config, "activation")
    if isinstance(activation, str) and spec.activation_names:  # a family's own name for an HF activation
        activation = spec.activation_names.get(activation, activation)
    if not isinstance(activation, str):
        activation = spec.activation
    stored = tuple(spec.stored_layers(config, L)) if spec.shared_layers else None
    moe = None
    if spec.experts is not None:
        experts, top_k = need("num_experts"), need("experts_per_token")
        if top_k > experts:
            raise SpecboundError(f"config.json: {top_k} experts per token but only {experts} experts: fix the config")
        shared_d_ff = need("shared_ff_size") if spec.experts.shared else None
        count = spec.config_value(config, "num_shared_experts") if spec.experts.shared else None
        if count is not None:  # n shared experts of one expert's width each, stored as one block
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                keys = " or ".join(spec.config_keys["num_shared_experts"])
                raise SpecboundError(f"config.json needs a non-negative integer {keys}, found {count!r}")
            shared_d_ff = shared_d_ff * count or None
        layers = expert_layers(spec.experts.layers, config, L)
        gate_max, gate_sum, scoring = spec.experts.gate_bounds(config, top_k)
        moe = MixtureOfExperts(
            experts=experts,
            top_k=top_k,
            shared_d_ff=shared_d_ff,
            shared_gate=spec.experts.shared_gate is not None and shared_d_ff is not None,
            layers=layers,
            dense_d_ff=need("dense_ff_size") if layers is not None else None,
            gate_max=gate_max,
            gate_sum=gate_sum,
            scoring=scoring,
        )
    return ModelDims(
        L=L,
        N=N,
        H=H,
        H_kv=H_kv,
        d_head=int(d_head),
        d_ff=d_ff,
        activation=activation,
        block=spec.block_for(config),
        feed_forward=spec.feed_forward,
        stored=stored,
        moe=moe,
        alibi=spec.alibi_for(config),
        position_terms=position_term_count(spec, config),
        latent=latent,
        up_offset=1.0 if spec.structure and "swiglu_limit" in spec.structure else 0.0,
    )


def expert_layers(rule: dict | None, config: dict, num_layers: int) -> tuple[int, ...] | None:
    """The layers holding the experts by the spec's ``experts.dense.layers`` rule (None: every layer):
    config.json's list of indices, or when absent every ``step``-th layer, the last of each ``step`` (Llama 4's
    ``moe_layers``, ``interleave_moe_layer_step``, as its config builds them)."""
    if rule is None:
        return None
    if not {"list", "step"} & set(rule):  # a range, an interval or one type per layer (DeepSeek, GLM, ERNIE)
        return _ranged_layers(rule, config, num_layers)
    listed = config.get(rule["list"]) if "list" in rule else None
    if listed is None and "step" in rule:
        step = config.get(rule["step"], rule.get("step_default", 1))
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise SpecboundError(
                f"config.json: {rule['step']}={step!r} must be a positive integer (every how many "
                f"layers one holds the experts)"
            )
        return tuple(range(step - 1, num_layers, step))
    if not isinstance(listed, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in listed
    ):
        raise SpecboundError(
            f"config.json: {rule.get('list')}={listed!r} must list the indices of the layers "
            f"holding the experts, each in [0, {num_layers})"
        )
    return tuple(sorted(set(listed)))


def _ranged_layers(rule: dict, config: dict, num_layers: int) -> tuple[int, ...]:
    """The layers holding the experts by ``first``, ``last``, ``interval`` and ``phase`` (layer ``l`` when
    ``first <= l <= last`` and ``(l + phase) % interval == 0``: DeepSeek's and GLM's first_k_dense_replace,
    ERNIE's start, end (-1: the last layer) and interval), or by ``types``, a config list of each layer's type
    (DeepSeek-V3.2's mlp_layer_types), when the config holds it."""
    types = config.get(rule["types"]) if rule.get("types") else None
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or not all(isinstance(t, str) for t in types):
            raise SpecboundError(
                f"config.json: {rule['types']} must list one type per layer ({num_layers}), found {types!r}"
            )
        return tuple(l for l, t in enumerate(types) if t == rule["expert_type"])

    def value(key: str, default: int) -> int:
        v = config.get(rule[key]) if rule.get(key) else None
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpecboundError(f"config.json: {rule[key]}={v!r} must be an integer (which layers hold the experts)")
        return v

    first, last, interval = value("first", 0), value("last", num_layers - 1), value("interval", 1)
    last = last + num_layers if last < 0 else last  # ERNIE's moe_layer_end_index -1: the last layer
    if interval < 1 or first < 0:
        raise SpecboundError(
            f"config.json: experts from layer {first} every {interval} layers: the first layer "
            f"must be >= 0 and the interval >= 1"
        )
    phase = rule.get("phase", 0)
    return tuple(l for l in range(max(first, 0), min(last, num_layers - 1) + 1) if (l + phase) % interval == 0)


# ``d_ff`` of a family whose config does not state it (DINOv2: ``mlp_ratio``, with SwiGLU's rounding)
# until :func:`infer_from_shapes` reads it from the stored weight.
FF_SIZE_FROM_TENSORS = 0


def position_term_count(spec: ArchSpec, config: dict) -> int:
    """How many disentangled position terms (DeBERTa's ``c2p``, ``p2c``) the config switches on, 0
    for a family without them.  The derivation (docs/theory.md 3h) needs each term to reuse the
    head's own query and key weights on normalised position embeddings; a config that says
    otherwise (``share_att_key: false``, un-normalised embeddings) is refused."""
    terms = spec.position_terms
    if not terms or not config.get(terms["enabled_by"], False):
        return 0
    listed = config.get(terms["config_key"]) or []
    if isinstance(listed, str):
        listed = listed.split("|")
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        raise SpecboundError(
            f"config.json: {terms['config_key']}={listed!r} must list the attention's position terms (c2p, p2c)"
        )
    listed = {t.strip().lower() for t in listed}
    unknown = sorted(listed - {"c2p", "p2c", "", "c2c"})
    if unknown:
        raise SpecboundError(
            f"config.json: {terms['config_key']} names the position term(s) {unknown}, which "
            f"specbound does not model (c2p, p2c are)"
        )
    count = len(listed & {"c2p", "p2c"})
    if count == 0:
        return 0
    for key, wanted in terms["requires"].items():
        value = config.get(key)
        entries = [v.strip().lower() for v in value.split("|")] if isinstance(value, str) else [value]
        if wanted not in entries:
            raise SpecboundError(
                f"config.json: {key}={value!r}, but the {spec.family} derivation needs {key} "
                f"to include {wanted!r} (docs/theory.md 3h): otherwise the attention logits hold "
                f"matrices or norms that the chain does not measure"
            )
    return count


def infer_kv_heads(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str) -> ModelDims:
    """``H_kv`` from the stored key weight when config.json does not name it (Mistral's and Qwen2's
    configs may omit ``num_key_value_heads``, whose library defaults are then 8 and 32, not ``H``).

    A fused ``qkv`` (``(H + 2 H_kv) d_h`` outputs) whose spec maps no ``num_kv_heads`` key takes
    ``H_kv`` from its width: Falcon's config keeps ``num_kv_heads`` even where ``multi_query`` means one
    key/value head, and GPT-2 or GPT-NeoX get ``H_kv = H``.  A shape that fits no ``H_kv`` leaves the
    dimensions as they are, for :func:`account_for_tensors` to report."""
    if "qkv" in spec.tensors:
        if "num_kv_heads" in spec.config_keys:
            return dims
        rule = spec.tensors["qkv"]
        shape = ckpt.shape(rule.name_for(0, prefix))
        width = (shape[0] if rule.layout == "linear" else shape[-1]) if len(shape) == 2 else -1
        twice_kv = width // dims.d_head - dims.H if width % dims.d_head == 0 else -1
        if twice_kv > 0 and twice_kv % 2 == 0 and dims.H % (twice_kv // 2) == 0:
            return replace(dims, H_kv=twice_kv // 2)
        return dims
    if (
        "k" not in spec.tensors
        or spec.config_value(ckpt.config, "num_kv_heads") is not None
        or "num_kv_heads" not in spec.config_keys
    ):
        return dims
    rule = spec.tensors["k"]
    shape = ckpt.shape(rule.name_for(0, prefix))
    rows = shape[0] if rule.layout == "linear" else shape[-1]
    if len(shape) == 2 and rows % dims.d_head == 0 and dims.H % (rows // dims.d_head) == 0:
        return replace(dims, H_kv=rows // dims.d_head)
    return dims


def infer_from_shapes(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str) -> ModelDims:
    """The dimensions config.json leaves to the stored weights: ``H_kv`` (:func:`infer_kv_heads`)
    and, for a family whose spec names no ``ff_size`` key, ``d_ff`` from layer 0's ``ff_out``."""
    dims = infer_kv_heads(spec, ckpt, dims, prefix)
    if dims.d_ff != FF_SIZE_FROM_TENSORS:
        return dims
    rule = spec.tensors["ff_out"]
    name = rule.name_for(dims.stored_layer(0), prefix)
    shape = ckpt.shape(name) if name in set(ckpt.names) else ()
    layout = ckpt.layout(name) or rule.layout if shape else rule.layout
    d_ff = (shape[1] if layout == "linear" else shape[0]) if len(shape) == 2 else 0
    if d_ff <= 0:
        raise SpecboundError(
            f"cannot read the feed-forward width of {ckpt.location} from {name!r} (found shape "
            f"{shape or 'no such tensor'}): the {spec.family} family reads it from that weight"
        )
    return replace(dims, d_ff=int(d_ff))


def _expected_shapes(dims: ModelDims, d_ff: int | None = None) -> dict[str, tuple[int, int]]:
    """Row-vector-orientation shape of each role's matrix (``d_ff``: a shared expert's own width)."""
    hd, kvd = dims.H * dims.d_head, dims.H_kv * dims.d_head
    d_ff = dims.d_ff if d_ff is None else d_ff
    return {
        "q": (dims.N, hd),
        "k": (dims.N, kvd),
        "v": (dims.N, kvd),
        "qkv": (dims.N, hd + 2 * kvd),
        "o": (hd, dims.N),
        "ff_in": (dims.N, d_ff),
        "ff_gate": (dims.N, d_ff),
        "ff_up": (dims.N, d_ff),
        "ff_gate_up": (dims.N, 2 * d_ff),
        "ff_out": (d_ff, dims.N),
        "router": (dims.N, dims.moe.experts if dims.moe else 0),
        "gate": (dims.N, 1),
    }


def layer_rules(
    spec: ArchSpec, dims: ModelDims, layer: int, prefix: str = ""
) -> list[tuple[str, str, TensorRule, tuple[int, int]]]:
    """Every tensor a stored layer must hold: ``(name, what, rule, row-oriented shape)``, ``what``
    naming it in messages (``ff_gate of expert 3``).  With a mixture of experts: the attention roles,
    the router, every expert's feed-forward roles, the shared expert's and its gate."""
    expected = _expected_shapes(dims)
    out = [(rule.name_for(layer, prefix), role, rule, expected[role]) for role, rule in spec.tensors.items()]
    if spec.latent is not None:
        out += latent_rules(spec, dims, layer, prefix)
    experts = spec.experts
    if experts is None:
        return out
    if not dims.routed(layer):  # a dense layer of a model whose experts are in some layers only (Llama 4)
        dense = _expected_shapes(dims, dims.moe.dense_d_ff)
        return out + [
            (rule.name_for(layer, prefix), f"{role} of the dense feed-forward", rule, dense[role])
            for role, rule in experts.dense.items()
        ]
    out.append((experts.router.name_for(layer, prefix), "router", experts.router, expected["router"]))
    banks = {role: rule for role, rule in experts.tensors.items() if rule.layout == BANK}
    out += [
        (rule.name_for(layer, prefix), f"{role} of every expert (a bank)", rule, expected[role])
        for role, rule in banks.items()
    ]
    single = {role: rule for role, rule in experts.tensors.items() if role not in banks}
    for e in range(dims.moe.experts) if single else ():  # banks only: no loop over a count the banks still check
        out += [
            (rule.name_for(layer, prefix, e), f"{role} of expert {e}", rule, expected[role])
            for role, rule in single.items()
        ]
    if experts.shared and dims.moe.shared_d_ff:
        shared = _expected_shapes(dims, dims.moe.shared_d_ff)
        out += [
            (rule.name_for(layer, prefix), f"{role} of the shared expert", rule, shared[role])
            for role, rule in experts.shared.items()
        ]
    if experts.shared_gate is not None and dims.moe.shared_d_ff:
        rule = experts.shared_gate
        out.append((rule.name_for(layer, prefix), "the shared expert's gate", rule, expected["gate"]))
    return out


def detect_prefix(spec: ArchSpec, ckpt: Checkpoint) -> str:
    """The name prefix (``""``, ``"bert."``, ...) under which this checkpoint stores layer 0.

    One of the spec's prefixes, else a wrapper module's attribute path before one of them
    (``m.`` for a model wrapped for ONNX export, ``module.`` for a DataParallel state dict), when
    exactly one such path holds the layer-0 query weight; every other tensor must still be a role
    tensor or ignored (:func:`account_for_tensors`).
    """
    names = set(ckpt.names)
    probe = spec.tensors["qkv" if "qkv" in spec.tensors else "o" if spec.latent else "q"]
    for prefix in spec.prefixes:
        if probe.name_for(0, prefix) in names:
            return prefix
    bare = probe.name_for(0)
    wrapped = sorted({n[: -len(bare)] for n in names if n.endswith("." + bare)})
    if len(wrapped) == 1:
        return wrapped[0]
    tried = [probe.name_for(0, p) for p in spec.prefixes]
    if wrapped:
        raise SpecboundError(
            f"ambiguous checkpoint: {ckpt.location} holds the {spec.family} family's layer-0 query weight "
            f"under {len(wrapped)} prefixes ({', '.join(repr(w) for w in wrapped)}): it holds more than one "
            f"model; save the one to analyse on its own"
        )
    raise SpecboundError(
        f"missing tensor: {ckpt.location} has none of {tried} (the {spec.family} family's layer-0 "
        f"query weight); is this checkpoint of another family? pass --arch-spec FILE to map its names "
        f"(`specbound arch infer SOURCE` drafts one)"
    )


def account_for_tensors(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str) -> None:
    """Check that every role tensor exists with the right shape and every other tensor is ignored
    (after the spec's refusals: a tensor or config value it names is an error of its own)."""
    check_strays(spec, ckpt, prefix, role_tensors(spec, ckpt, dims, prefix))


def role_tensors(
    spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, *, rules: dict | None = None, suffix: str = ""
) -> set[str]:
    """The names of every tensor the spec reads at every stored layer (its roles, a mixture's experts,
    output scales, query/key norm gains), each checked to exist with the shape ``dims`` implies; with
    ``rules``, those rules' tensors only (a decoder's cross-attention, ``suffix`` ``_cross`` naming
    them in messages)."""
    names = set(ckpt.names)
    spec.refused(ckpt.config, sorted(names), prefix)
    stored_layers = dims.L if dims.stored is None else len(set(dims.stored))
    per_layer = len(rules) if rules is not None else len(spec.tensors)
    # one tensor per expert (a bank: one for all) in each layer holding experts: every layer, or the listed ones
    per_expert_layer = (
        0
        if rules is not None or dims.moe is None
        else 1
        if any(r.layout == BANK for r in spec.experts.tensors.values())
        else dims.moe.experts
    )
    expert_layers = 0
    if per_expert_layer and dims.moe.layers is None:
        per_layer += per_expert_layer
    elif per_expert_layer:
        expert_layers = len(dims.moe.layers)
    # before listing every layer or expert: L or E may be 10**30
    if stored_layers * per_layer + expert_layers * per_expert_layer > len(names):
        experts = (
            f" and {expert_layers:,} layers holding experts, {per_expert_layer:,} expert tensors each"
            if expert_layers
            else ""
        )
        raise SpecboundError(
            f"config.json says {dims.L} layers{'' if dims.stored is None else f' ({stored_layers} stored)'} of "
            f"{per_layer} role tensors each{experts}, "
            f"but {ckpt.location} holds {len(names)} tensors in all: the checkpoint is incomplete or its "
            f"config does not match it"
        )
    expected = _expected_shapes(dims)
    wanted, scales = {}, {}
    for layer in sorted({dims.stored_layer(l) for l in range(dims.L)}):
        entries = (
            layer_rules(spec, dims, layer, prefix)
            if rules is None
            else [(rule.name_for(layer, prefix), role, rule, expected[role]) for role, rule in rules.items()]
        )
        for name, what, rule, shape in entries:
            wanted[name] = (what + suffix, rule.layout, layer, shape)
            if rule.output_scale is not None:
                scales[rule.scale_for(layer, prefix)] = (what + suffix, layer)
    for name, (role, layer) in scales.items():
        shape = ckpt.shape(name) if name in names else None
        if shape is None or tuple(shape) != (dims.N,):
            found = "is missing" if shape is None else f"has shape {tuple(shape)}"
            raise SpecboundError(
                f"tensor {name!r} (the output scale of {role} in layer {layer}) {found}; the "
                f"{spec.family} family needs a ({dims.N},) vector there: the checkpoint is "
                f"incomplete or its config does not match it"
            )
    gains = qk_norm_shapes(spec, dims, prefix) if rules is None else {}
    for name, (role, layer, shape) in gains.items():
        if name not in names:
            raise SpecboundError(
                f"missing tensor {name!r} ({role} of layer {layer}): the {spec.family} family normalises "
                f"{'its latents' if spec.latent else 'queries and keys (qk_norm in ' + spec.origin + ')'}; the "
                f"checkpoint is incomplete or of another family"
            )
        if tuple(ckpt.shape(name)) != shape and spec.latent is not None:
            raise SpecboundError(
                f"tensor {name!r} has shape {tuple(ckpt.shape(name))}, but config.json ({_latent_said(spec, dims)}) "
                f"implies {shape} for {role} of layer {layer}: the config does not describe these weights"
            )
        if tuple(ckpt.shape(name)) != shape:
            raise SpecboundError(
                f"tensor {name!r} has shape {tuple(ckpt.shape(name))}, but a {role} over "
                f"{'each head' if spec.qk_norm.span == 'head' else 'the whole projection'} with heads={dims.H}, "
                f"kv heads={dims.H_kv}, head_dim={dims.d_head} has {shape}: the config or the spec's qk_norm span "
                f"does not describe these weights"
            )
    for name, (role, layout, layer, (rows, cols)) in wanted.items():
        if (
            name not in names
            and dims.moe is not None
            and not any(r.layout == BANK for r in spec.experts.tensors.values())
        ):
            _refuse_expert_banks(ckpt, names)  # a bank where the spec names one tensor per expert
        if name not in names:
            raise SpecboundError(
                f"missing tensor {name!r} ({role} of layer {layer}): config.json says "
                f"{dims.L} layers{_experts_said(dims)}; the checkpoint is incomplete or its config does not match it"
            )
        stored = ckpt.shape(name)
        layout = ckpt.layout(name) or layout  # the format's own orientation (ONNX) wins
        want = (
            (dims.moe.experts, rows, cols) if layout == BANK else (cols, rows) if layout == "linear" else (rows, cols)
        )
        if stored != want:
            raise SpecboundError(
                f"tensor {name!r} has shape {stored}, but config.json (hidden_size={dims.N}, "
                f"heads={dims.H}, head_dim={dims.d_head}, ff_size={dims.d_ff}{_experts_said(dims)}"
                f"{', ' + _latent_said(spec, dims) if spec.latent is not None else ''}) implies {want} "
                f"for a {layout} {role} weight: the config does not describe these weights"
            )
    return set(wanted) | set(scales) | set(gains)


def check_strays(spec: ArchSpec, ckpt: Checkpoint, prefix: str, accounted: set[str]) -> None:
    """Every tensor not in ``accounted`` must match one of the spec's ignore patterns, and none of them
    may be a linear-attention or state-space weight (:func:`.hybrids.refuse_ignored_recurrent`)."""
    refuse_ignored_recurrent(ckpt.names, accounted, spec.family, spec.origin)
    stray = [n for n in ckpt.names if n not in accounted and not spec.is_ignored(n, prefix)]
    if stray:
        shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        raise SpecboundError(
            f"unaccounted tensors in {ckpt.location}: {shown} are neither a {spec.family} role tensor "
            f"nor ignored by its spec ({spec.origin}); add them to the spec's ignore list or use "
            f"--arch-spec FILE"
        )


def _refuse_expert_banks(ckpt: Checkpoint, names: set[str]) -> None:
    """A mixture of experts whose experts are stored as 3-D banks (transformers 5 holds a loaded
    Mixtral or Qwen-MoE this way in memory: ``mlp.experts.gate_up_proj``) where the spec names one
    tensor per expert: said as such, not as a missing tensor."""
    banks = sorted(n for n in names if "expert" in n and len(ckpt.shape(n)) == 3)
    if banks:
        raise SpecboundError(
            f"{ckpt.location} holds its experts as 3-D banks ({banks[0]} {tuple(ckpt.shape(banks[0]))}, every expert "
            f"along the first axis), as transformers 5 keeps a loaded mixture of experts in memory; the family spec "
            f"names one tensor per expert, as the saved files hold them: save the model with save_pretrained and "
            f"analyse the folder"
        )


def _latent_said(spec: ArchSpec, dims: ModelDims) -> str:
    return latent_config_said(spec, dims)


def _experts_said(dims: ModelDims) -> str:
    if dims.moe is None:
        return ""
    shared = f", a shared expert of width {dims.moe.shared_d_ff}" if dims.moe.shared_d_ff else ""
    return f", {dims.moe.experts} experts{shared}"


def qk_norm_shapes(spec: ArchSpec, dims: ModelDims, prefix: str) -> dict[str, tuple[str, int, tuple[int]]]:
    """Every stored layer's query/key norm gain: name -> (what, layer, expected shape)."""
    rule = spec.qk_norm
    if spec.latent is not None:
        return latent_gain_shapes(spec, dims, prefix, sorted({dims.stored_layer(l) for l in range(dims.L)}))
    if rule is None or rule.gain == "none":
        return {}
    per = {"q": dims.H, "k": dims.H_kv} if rule.span == "all_heads" else {"q": 1, "k": 1}
    out = {}
    for layer in sorted({dims.stored_layer(l) for l in range(dims.L)}):
        for which, name in zip("qk", rule.names_for(layer, prefix)):
            out[name] = (f"{which}_norm gain", layer, (per[which] * dims.d_head,))
    return out


def qk_norm_eps(spec: ArchSpec, config: dict) -> float:
    """The query/key norm's epsilon from config.json (the spec's ``eps`` keys, else its
    ``eps_default``); it must be positive: without it the normalised logit has no Lipschitz constant."""
    rule = spec.qk_norm
    value = next((config[k] for k in rule.eps if config.get(k) is not None), rule.eps_default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise SpecboundError(
            f"config.json needs a positive {' or '.join(rule.eps)} for the {spec.family} family's query/key "
            f"normalisation, found {value!r}: with eps = 0 the normalised logit has no Lipschitz constant "
            f"(docs/theory.md section 3d)"
        )
    return float(value)
