"""PEFT LoRA adapters: a folder with ``adapter_config.json`` and ``adapter_model.safetensors`` (or
``adapter_model.bin``), read together with its base model as the merged model.

A LoRA adapter replaces a base weight ``W0`` (``(out, in)``, torch ``nn.Linear`` layout) by

    W = W0 + s B A,    s = lora_alpha / r   (rsLoRA, ``use_rslora``: s = lora_alpha / sqrt(r)),

with ``A`` (``lora_A``, ``(r, in)``) and ``B`` (``lora_B``, ``(out, r)``).  A weight stored as
``(in, out)`` (GPT-2's ``Conv1D``, ``fan_in_fan_out``) and an embedding (``lora_embedding_A``
``(r, vocab)``, ``lora_embedding_B`` ``(dim, r)``) take the transpose ``s (B A)^T``.  A module in
``modules_to_save`` is stored whole in the adapter and replaces the base tensor, and so does the
``base_layer`` weight PEFT saves beside an adapted embedding (the update then applies to it).

:class:`LoraCheckpoint` serves the merged tensors under the base's names, so every family reads an
adapted model as it reads the base (a fused qkv included), and :meth:`LoraCheckpoint.delta_factors`
serves each update as its two factors, never multiplied out, for the norms of ``W - W0``
(docs/theory.md section 3k).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
import regex

from ..errors import SpecboundError
from ..options import COUNT, Interval, shown
from .base import MAX_SMALL_FILE_BYTES, Checkpoint, load_json
from .hub_cache import looks_like_hub_id, resolve_hub_id
from .pytorch import from_pickle_file
from .safetensors_file import open_safetensors_file
from .shard_index import inside

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# PeftModel.save_pretrained names every tensor by its module's path in the PeftModel.
_PEFT_PREFIX = "base_model.model."
# A pattern of rank_pattern / alpha_pattern is matched with a timeout (the adapter's file is input).
_PATTERN_TIMEOUT = 1.0
# ... and all of one adapter's pattern matching within this many seconds.
_PATTERN_BUDGET = 5.0
# Config keys whose feature changes the adapted function in a way a merged W0 + s B A does not
# express; a truthy value is refused with the reason.
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora) rescales every merged column by a learned magnitude, so W - W0 is not s B A",
    "lora_bias": "lora_bias adds a bias to lora_B, which the merged weights alone do not carry",
    "layer_replication": "layer_replication duplicates base layers, so the adapted model has more layers than its base",
    "target_parameters": "target_parameters adapts raw nn.Parameters (fused experts), not Linear modules",
    "trainable_token_indices": "trainable_token_indices trains single embedding rows beside the adapter",
    "alora_invocation_tokens": "activated LoRA applies the update only after its invocation tokens, so the adapted "
    "model is not one merged weight",
    "use_qalora": "QA-LoRA pools the input of quantized layers before lora_A",
    "use_bdlora": "BD-LoRA's block-diagonal factors",
    "arrow_config": "Arrow routing mixes several adapters per token",
}


def is_adapter_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding ``adapter_config.json`` (a PEFT adapter; whatever the
    entry is: a FIFO or a device there is refused by the reader, in one line)."""
    config = path / ADAPTER_CONFIG
    return path.is_dir() and (config.exists() or config.is_symlink())


@dataclass(frozen=True)
class LoraUpdate:
    """The update of one base tensor: ``W = W0 + scale * B @ A`` (``transposed``: its transpose).

    ``a_name`` / ``b_name`` are the adapter's tensors ``lora_A`` ``(r, in)`` and ``lora_B`` ``(out, r)``
    (of an embedding: ``(r, vocab)``, ``(dim, r)``), None for a tensor only replaced; ``replace_name``:
    an adapter tensor that stands in for ``W0`` (a ``modules_to_save`` module's, or an adapted
    embedding's saved ``base_layer``), None when ``W0`` is the base's."""

    target: str
    a_name: str | None = None
    b_name: str | None = None
    rank: int = 0
    alpha: float = 0.0
    scale: float = 0.0
    transposed: bool = False
    replace_name: str | None = None
    # a square update of a module that is not an embedding: its orientation is the module's layout
    # (LoraCheckpoint.use_layouts), not its shape
    square: bool = False


class LoraCheckpoint(Checkpoint):
    """A base checkpoint with a LoRA adapter merged in, tensor by tensor, as it is read.

    It keeps no state of its own beyond its tables: each read goes to the base's and the adapter's
    ``read``, which take their own locks, so layers read in parallel threads merge in parallel.

    Attributes
    ----------
    base_ckpt : Checkpoint
        The base model (its config, names and every tensor the adapter leaves alone).
    adapter : Checkpoint
        The adapter's own tensors (``lora_A``, ``lora_B``, ``modules_to_save``).
    updates : dict[str, LoraUpdate]
        Base tensor name -> its update.
    """

    _read_lock = contextlib.nullcontext()

    def __init__(
        self,
        folder: Path,
        adapter_config: dict[str, Any],
        adapter: Checkpoint,
        base: Checkpoint,
        base_name: str,
        base_found: str,
    ):
        self.folder, self.adapter_config, self.adapter, self.base_ckpt = folder, adapter_config, adapter, base
        self.base_name, self.base_found = base_name, base_found
        self.location = str(folder)
        self.config = base.config
        # the base's facts whole (its config.json, its notes), but the source is the adapter, not its base
        self.forward_facts(base, hub_source=None)
        self.updates = _match_updates(adapter_config, adapter, base, folder, base_name)

    @property
    def names(self) -> list[str]:
        return self.base_ckpt.names

    def shape(self, name: str) -> tuple[int, ...]:
        return self.base_ckpt.shape(name)

    def dtype(self, name: str) -> str:
        update = self.updates.get(name)
        if update is not None and update.replace_name is not None:
            return self.adapter.dtype(update.replace_name)
        return self.base_ckpt.dtype(name)

    def layout(self, name: str) -> str | None:
        return self.base_ckpt.layout(name)

    def where(self, name: str) -> str:
        update = self.updates.get(name)
        if update is None:
            return self.base_ckpt.where(name)
        if update.replace_name is not None:
            return f"{self.adapter.where(update.replace_name)} (the adapter's own copy of {name})"
        return f"{self.base_ckpt.where(name)} + the LoRA adapter {self.folder}"

    def files(self) -> list[Path]:
        return sorted(set(self.base_ckpt.files()) | set(self.adapter.files()))

    def _stored_in(self, name: str) -> Path | None:
        update = self.updates.get(name)
        if update is not None and update.replace_name is not None:
            return self.adapter._stored_in(update.replace_name)
        return self.base_ckpt._stored_in(name)

    def _raw(self, name: str) -> np.ndarray:
        """The merged tensor ``W0 + delta`` in float64 (the base's and the adapter's reads checked)."""
        update = self.updates.get(name)
        if update is None:
            return self.base_ckpt.read(name)
        w0 = self.base_ckpt.read(name) if update.replace_name is None else self.adapter.read(update.replace_name)
        if update.a_name is None:
            return w0
        first, second = self._factors(update)
        return w0 + first @ second

    def delta_factors(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``(P, Q)`` with the stored tensor's update ``W - W0 = P @ Q`` (stored orientation), or None
        for a tensor the adapter leaves alone.

        ``P = s B`` ``(out, r)``, ``Q = A`` ``(r, in)``; transposed (``fan_in_fan_out``, embeddings):
        ``P = A^T``, ``Q = s B^T``.  A tensor whose ``W0`` the adapter replaces has no such factors:
        an error (callers check :meth:`replaced` first).
        """
        update = self.updates.get(name)
        if update is None or update.a_name is None:
            return None
        if update.replace_name is not None:
            raise ValueError(f"{name} is replaced whole by the adapter: W - W0 has no low-rank factors")
        return self._factors(update)

    def _factors(self, update: LoraUpdate) -> tuple[np.ndarray, np.ndarray]:
        """``(P, Q)`` of :meth:`delta_factors`: the update of the tensor's own ``W0`` (the base's, or
        the one the adapter saved)."""
        a, b = self.adapter.read(update.a_name), self.adapter.read(update.b_name)
        if update.transposed:
            return np.ascontiguousarray(a.T), np.ascontiguousarray(update.scale * b.T)
        return update.scale * b, a

    def use_layouts(self, in_out) -> None:
        """Orient every square update as PEFT does, by its module's kind: ``in_out(name)`` is True
        for a module stored ``(in, out)`` (GPT-2's ``Conv1D``: ``s (B A)^T``), False for an
        ``nn.Linear`` (``s B A``, whatever ``fan_in_fan_out`` says: PEFT resets it), None when the
        family spec does not say (the flag stays).  A layout the format decides (``layout()``)
        wins.  Called by the pipeline once the family spec is known."""
        for name, update in list(self.updates.items()):
            if not update.square or self.base_ckpt.layout(name) is not None:
                continue
            found = in_out(name)
            if found is not None and found != update.transposed:
                self.updates[name] = replace(update, transposed=bool(found))

    def replaced(self, name: str) -> bool:
        """Whether the adapter replaces ``name``'s ``W0`` by a tensor of its own (``modules_to_save``, a
        saved ``base_layer``): ``W - W0`` is then not low rank."""
        update = self.updates.get(name)
        return update is not None and update.replace_name is not None

    def describe(self) -> dict[str, Any]:
        """The adapter, for the records' ``model.adapter``."""
        cfg, low_rank = self.adapter_config, [u for u in self.updates.values() if u.a_name is not None]
        return {
            "path": str(self.folder),
            "peft_type": "LORA",
            "base": self.base_name,
            "base_found": self.base_found,
            "base_location": str(self.base_ckpt.location),
            "r": cfg.get("r"),
            "lora_alpha": cfg.get("lora_alpha"),
            "use_rslora": bool(cfg.get("use_rslora")),
            "fan_in_fan_out": bool(cfg.get("fan_in_fan_out")),
            "target_modules": _listed(cfg.get("target_modules")),
            "modules_to_save": _listed(cfg.get("modules_to_save")),
            "ranks": sorted({u.rank for u in low_rank}),
            "scales": sorted({u.scale for u in low_rank}),
            "adapted_tensors": sorted(u.target for u in low_rank),
            "replaced_tensors": sorted(u.target for u in self.updates.values() if u.replace_name is not None),
        }

    def close(self) -> None:
        self.adapter.close()
        self.base_ckpt.close()


def _listed(value) -> list[str] | str | None:
    if value is None or isinstance(value, str):
        return value
    return sorted(str(v) for v in value)


def adapter_summary(cfg: dict[str, Any]) -> str:
    """``"a PEFT LoRA adapter (r=8, lora_alpha=16, targets q_proj, v_proj)"`` for messages."""
    targets = _listed(cfg.get("target_modules"))
    shown = targets if isinstance(targets, str) or targets is None else ", ".join(targets)
    return (
        f"a PEFT {cfg.get('peft_type', '?')} adapter (r={cfg.get('r')}, lora_alpha={cfg.get('lora_alpha')}, "
        f"targets {shown})"
    )


def read_adapter_config(folder: Path) -> dict[str, Any]:
    """``adapter_config.json``, checked to describe an adapter specbound can merge (one line naming
    what is unsupported otherwise)."""
    cfg = load_json(
        folder / ADAPTER_CONFIG, "PEFT adapter config", "re-save the adapter with save_pretrained", MAX_SMALL_FILE_BYTES
    )
    if not isinstance(cfg, dict):
        raise SpecboundError(f"{folder / ADAPTER_CONFIG} must hold a JSON object, found {type(cfg).__name__}")
    kind = str(cfg.get("peft_type", "")).upper()
    if kind != "LORA":
        raise SpecboundError(
            f"{folder} is a PEFT {cfg.get('peft_type') or 'adapter of no peft_type'} adapter: specbound reads LoRA "
            f"adapters only (peft_type LORA); an adapter that merges into its base (IA3, LoHa, ...): "
            f"merge_and_unload(), save_pretrained and analyse the merged model; prompt learning (prefix or "
            f"prompt tuning) changes no weight matrix"
        )
    for key, reason in _UNSUPPORTED.items():
        if cfg.get(key):
            raise SpecboundError(
                f"{folder} is {adapter_summary(cfg)} with {key}: {reason}; merge it "
                f"(merge_and_unload(), save_pretrained) and analyse the merged model"
            )
    where = folder / ADAPTER_CONFIG
    _check_number(where, "r", cfg.get("r"), integral=True)
    _check_number(where, "lora_alpha", cfg.get("lora_alpha"), integral=False)
    for key in ("use_rslora", "fan_in_fan_out"):
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise SpecboundError(f"{where} gives {key}={shown(cfg[key])}: expected true or false; {_RESAVE}")
    for key in ("target_modules", "modules_to_save"):
        value = cfg.get(key)
        if (
            value is not None
            and not isinstance(value, str)
            and not (isinstance(value, list) and len(value) <= MAX_PATTERNS and all(isinstance(v, str) for v in value))
        ):
            raise SpecboundError(
                f"{where} gives {key}={shown(value)}: expected a module name, a regular expression "
                f"or a list of at most {MAX_PATTERNS:,} module names; {_RESAVE}"
            )
    for key, integral in (("rank_pattern", True), ("alpha_pattern", False)):
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or len(value) > MAX_PATTERNS:
            found = f"{len(value):,} keys" if isinstance(value, dict) else shown(value)
            raise SpecboundError(
                f"{where} gives {key} as {found}: expected an object of at most {MAX_PATTERNS:,} "
                f"module patterns, each a number; {_RESAVE}"
            )
        for pattern, number in value.items():
            _check_number(where, f"{key}[{pattern[:60]!r}]", number, integral=integral)
    return cfg


# A rank_pattern / alpha_pattern / target_modules of more entries than any model has modules is
# refused (each pattern is matched against every adapted module).
MAX_PATTERNS = 1000
# The largest lora_alpha (or alpha_pattern value) read: real adapters use 1 to a few hundred; with
# rank >= 1 the scale s = alpha / r stays far inside float range, so no merged weight overflows.
MAX_ALPHA = 1e6
_RESAVE = "re-save the adapter with save_pretrained"


def _check_number(where: Path, key: str, value: Any, *, integral: bool) -> None:
    """A rank (a positive integer of at most 2^53) or an alpha (a positive finite number of at most
    :data:`MAX_ALPHA`), in the vocabulary of :mod:`specbound.options`; one line otherwise."""
    accepted = COUNT if integral else Interval(Real, 0, MAX_ALPHA, "right")
    if not accepted.accepts(value):
        expected = (
            "a positive number: a whole rank of at most 2^53"
            if integral
            else f"a positive number: finite, at most {MAX_ALPHA:g}"
        )
        raise SpecboundError(f"{where} gives {key}={shown(value)}: expected {expected}; {_RESAVE}")


def adapter_weights(folder: Path) -> Checkpoint:
    """The adapter's tensors: ``adapter_model.safetensors``, else ``adapter_model.bin`` (read with
    ``weights_only=True``)."""
    for name in ADAPTER_WEIGHTS:
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                return open_safetensors_file(path, {})
            return from_pickle_file(path, {})
    present = sorted(p.name for p in folder.iterdir())[:20]
    raise SpecboundError(
        f"{folder} has {ADAPTER_CONFIG} but no adapter weights: expected "
        f"{' or '.join(ADAPTER_WEIGHTS)}, found {present}; re-save the adapter with save_pretrained"
    )


def open_adapter(folder: Path, base: Any, config: dict[str, Any] | None, open_checkpoint) -> LoraCheckpoint:
    """The adapter in ``folder`` merged into ``base`` (a source as for any analysis; None: the
    adapter's ``base_model_name_or_path`` when it resolves to a local folder or a hub id), opened with
    ``open_checkpoint(source, config)`` (:func:`~.dispatch.open_checkpoint`)."""
    cfg = read_adapter_config(folder)
    named = cfg.get("base_model_name_or_path")
    found = "given"
    if base is None:
        base, found = _named_base(folder, cfg, named)
        base_name = str(named)
    else:
        base_name = str(base) if isinstance(base, (str, Path)) else f"in-memory {type(base).__name__}"
    if isinstance(base, (str, Path)) and is_adapter_folder(Path(base).expanduser()):
        raise SpecboundError(
            f"the base {base} is itself a PEFT adapter folder; pass the base model the adapter "
            f"{folder} was trained on (a model folder, weights file or hub id)"
        )
    base_ckpt = open_checkpoint(base, config)
    try:
        adapter = adapter_weights(folder)
        try:
            return LoraCheckpoint(folder, cfg, adapter, base_ckpt, base_name, found)
        except BaseException:
            adapter.close()
            raise
    except BaseException:
        base_ckpt.close()
        raise


# How the base of an adapter was found (the records' model.adapter.base_found), in the order PEFT and
# transformers try a base_model_name_or_path: as written (a relative path from the current directory),
# then from the adapter's folder, then a hub id.
BASE_FOUND = {
    "given": "given with --base",
    "as named": "the path the adapter names, as written",
    "adapter folder": "the path the adapter names, read from the adapter's folder",
    "hub id": "the hub id the adapter names",
}


def _named_base(folder: Path, cfg: dict[str, Any], named: Any) -> tuple[Any, str]:
    """The base an adapter names and how it was found (a key of :data:`BASE_FOUND`), tried as PEFT's
    ``from_pretrained`` does: the path as written (from the current directory when relative), then
    relative to the adapter's folder, then a hub id; one line saying what is needed otherwise."""
    what = f"{folder} is {adapter_summary(cfg)}"
    if not isinstance(named, str) or not named.strip():
        raise SpecboundError(
            f"{what} and names no base model (base_model_name_or_path is empty); pass the base "
            f"it was trained on with --base BASE (a model folder, weights file or hub id)"
        )
    path = Path(named).expanduser()
    if path.exists():  # as written: what PEFT's from_pretrained loads first
        return path, "as named"
    if not path.is_absolute():
        # PEFT records the path the base was loaded from, relative to wherever training ran: from the
        # adapter's folder it must stay within the folder holding the adapter
        path = folder / path
        if path.exists() or path.is_symlink():
            if not inside(folder.absolute().parent, path):
                raise SpecboundError(
                    f"{what} for the base model {named[:200]!r}, which leads outside the folder "
                    f"holding the adapter ({folder.absolute().parent}); pass the base with --base BASE"
                )
            return path, "adapter folder"
    not_here = (
        f"{what} for the base model {named[:200]!r}, which is neither a path here ({Path.cwd()}) nor in "
        f"the adapter's folder"
    )
    fix = "pass the base with --base BASE (a model folder, weights file or hub id)"
    if looks_like_hub_id(named):
        try:
            return resolve_hub_id(named), "hub id"
        except SpecboundError as exc:
            reason = str(exc).split(";")[0]
            raise SpecboundError(f"{not_here}, and as a hub id cannot be opened ({reason}); {fix}") from None
    raise SpecboundError(f"{not_here}, nor a hub id; {fix}")


def _module_of(key: str) -> tuple[str, str] | None:
    """``(module path, part)`` of an adapter tensor name, ``part`` one of ``A``, ``B``, ``EA``, ``EB``
    (embedding factors), ``magnitude`` (DoRA), ``other``; None for a ``modules_to_save`` tensor."""
    name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
    for marker, part in (
        (".lora_A.", "A"),
        (".lora_B.", "B"),
        (".lora_embedding_A", "EA"),
        (".lora_embedding_B", "EB"),
        (".lora_magnitude_vector", "magnitude"),
    ):
        if marker in name:
            return name.split(marker)[0], part + (
                "" if part in ("EA", "EB", "magnitude") or name.endswith(".weight") else ".bias"
            )
    if ".lora_" in name:
        return name.split(".lora_")[0], "other"
    return None


def _saved_target(key: str) -> str:
    """The module tensor a saved whole tensor replaces (``classifier.modules_to_save.weight`` and
    ``classifier.weight`` both name ``classifier.weight``, ``embed_tokens.base_layer.weight``
    ``embed_tokens.weight``)."""
    name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
    for marker in (".modules_to_save.default.", ".modules_to_save.", ".base_layer."):
        name = name.replace(marker, ".")
    return name


def _base_name(candidate: str, names: set[str], by_suffix: dict[str, list[str]]) -> str | None:
    """The base tensor ``candidate`` (a module path + ``.weight``) names: itself, else the same name
    without leading modules (an adapter trained on ``BertForSequenceClassification``'s ``bert.``), else
    the one base name ending in it (a base saved with a prefix the adapter's model lacked)."""
    if candidate in names:
        return candidate
    parts = candidate.split(".")
    for start in range(1, len(parts) - 1):
        shorter = ".".join(parts[start:])
        if shorter in names:
            return shorter
    longer = by_suffix.get(candidate, [])
    return longer[0] if len(longer) == 1 else None


class _Patterns:
    """PEFT's per-module overrides (``rank_pattern`` / ``alpha_pattern``, checked by
    :func:`read_adapter_config`: at most :data:`MAX_PATTERNS` keys), each key compiled once: the
    value of the first key matching the module path's end (``(.*\\.)?key$``, PEFT's
    ``get_pattern_key``).  Matching is linear in the keys, and all of an adapter's matching shares
    one time budget (a catastrophically backtracking key is one line, not minutes)."""

    def __init__(self, patterns: dict | None, what: str):
        self.what = what
        self.compiled = []
        for key, value in (patterns or {}).items():
            try:
                self.compiled.append((key, regex.compile(rf"(.*\.)?(?:{key})$"), value))
            except (regex.error, RecursionError, OverflowError):
                self._refuse(key)
        self.deadline = time.monotonic() + _PATTERN_BUDGET

    def _refuse(self, key: str):
        raise SpecboundError(
            f"the adapter's pattern {key[:80]!r} is not a regular expression specbound can match "
            f"within {_PATTERN_BUDGET:g} s (in {self.what} of {ADAPTER_CONFIG})"
        ) from None

    def value(self, module: str, default: float) -> float:
        for key, pattern, value in self.compiled:
            try:
                if pattern.match(module, timeout=max(1e-3, min(_PATTERN_TIMEOUT, self.deadline - time.monotonic()))):
                    return value
            except TimeoutError:
                self._refuse(key)
        return default


def _match_updates(
    cfg: dict[str, Any], adapter: Checkpoint, base: Checkpoint, folder: Path, base_name: str
) -> dict[str, LoraUpdate]:
    """Every adapter tensor matched to the base tensor it updates, shapes checked (one line for an
    adapter tensor without a base tensor, a shape that does not fit, or an unsupported kind)."""
    names = set(base.names)
    by_suffix: dict[str, list[str]] = {}
    for n in names:
        parts = n.split(".")
        for start in range(1, len(parts) - 1):
            by_suffix.setdefault(".".join(parts[start:]), []).append(n)
    modules: dict[str, dict[str, str]] = {}
    replaced: dict[str, str] = {}
    updates: dict[str, LoraUpdate] = {}

    def target_of(candidate: str, key: str) -> str:
        found = _base_name(candidate, names, by_suffix)
        if found is None:
            raise SpecboundError(
                f"the adapter tensor {key} in {folder} updates {candidate}, which the base {base_name} does not "
                f"hold: the adapter was trained on another model; pass its base with --base BASE"
            )
        return found

    for key in adapter.names:
        found = _module_of(key)
        if found is None:
            target = target_of(_saved_target(key), key)
            if adapter.shape(key) != base.shape(target):
                raise SpecboundError(
                    f"the adapter's modules_to_save tensor {key} has the shape {adapter.shape(key)} "
                    f"but the base's {target} is {base.shape(target)}: the adapter was trained on "
                    f"another model; pass its base with --base BASE"
                )
            if target in replaced:
                raise SpecboundError(
                    f"{folder} replaces {target} twice ({replaced[target]} and {key}); re-save the "
                    f"adapter with save_pretrained"
                )
            replaced[target] = key
            continue
        module, part = found
        if part == "magnitude":
            raise SpecboundError(
                f"{folder} holds DoRA magnitudes ({key}): DoRA rescales every merged column, so "
                f"W - W0 is not s B A; merge_and_unload() and analyse the merged model"
            )
        if part in ("other", "A.bias", "B.bias"):
            raise SpecboundError(
                f"{folder} holds the adapter tensor {key}, which is not a LoRA factor specbound "
                f"merges (lora_A.weight, lora_B.weight, lora_embedding_A/B); merge_and_unload() "
                f"and analyse the merged model"
            )
        held = modules.setdefault(module, {})
        if part in held:  # base_model.model.X.lora_A.weight and X.lora_A.weight: PEFT would load one
            raise SpecboundError(
                f"{folder} holds two lora_{part[-1]} factors of {module} ({held[part]} and {key}); "
                f"which one PEFT loads depends on their order: {_RESAVE}"
            )
        held[part] = key
    fan_in_fan_out = bool(cfg.get("fan_in_fan_out"))
    alpha_patterns = _Patterns(cfg.get("alpha_pattern"), "alpha_pattern")
    rank_patterns = _Patterns(cfg.get("rank_pattern"), "rank_pattern")
    for module, parts in sorted(modules.items()):
        embedding = "EA" in parts or "EB" in parts
        a_key, b_key = (parts.get("EA"), parts.get("EB")) if embedding else (parts.get("A"), parts.get("B"))
        if a_key is None or b_key is None:
            raise SpecboundError(
                f"{folder} holds only one LoRA factor of {module} ({a_key or b_key}): an adapter "
                f"has both lora_A and lora_B; re-save it with save_pretrained"
            )
        a_shape, b_shape = adapter.shape(a_key), adapter.shape(b_key)
        if len(a_shape) != 2 or len(b_shape) != 2:
            raise SpecboundError(
                f"the LoRA factors of {module} in {folder} have the shapes {a_shape} and {b_shape}: "
                f"LoRA on a convolution is not supported (only Linear, Conv1D and Embedding "
                f"modules); merge_and_unload() and analyse the merged model"
            )
        rank = a_shape[0]
        if rank == 0:
            raise SpecboundError(
                f"the LoRA factors of {module} in {folder} have rank 0 (lora_A is {a_shape}): "
                f"PEFT's scale alpha / r is undefined; {_RESAVE}"
            )
        if b_shape[1] != rank:
            raise SpecboundError(
                f"the LoRA factors of {module} in {folder} do not multiply: lora_A is {a_shape} "
                f"and lora_B is {b_shape}; re-save the adapter with save_pretrained"
            )
        declared = rank_patterns.value(module, cfg["r"])
        if rank != declared:  # PEFT scales by the declared r and could not load these factors
            raise SpecboundError(
                f"the LoRA factors of {module} in {folder} have rank {rank} (lora_A is {a_shape}) but "
                f"{ADAPTER_CONFIG} declares r={declared} for it (r or rank_pattern): PEFT would not "
                f"load them, and its scale alpha / r would not be this rank's; {_RESAVE}"
            )
        target = target_of(module + ".weight", a_key)
        stored = tuple(base.shape(target))
        # PEFT merges s (B A)^T into a Conv1D and an embedding, s B A into an nn.Linear whatever
        # fan_in_fan_out says (it warns and resets the flag for a Linear, sets it for a Conv1D, and
        # saves the flag it ended with): the shapes decide where they can; a square weight's
        # orientation is the format's (in, out) storage, else the flag PEFT saved, until the family
        # spec names the module's layout (LoraCheckpoint.use_layouts, called when a spec is bound).
        plain, flipped = (b_shape[0], a_shape[1]), (a_shape[1], b_shape[0])
        square = plain == flipped and not embedding
        if not square:
            transposed = embedding or stored == flipped
        else:
            layout = base.layout(target)
            transposed = fan_in_fan_out if layout is None else layout == "conv1d"
        delta_shape = flipped if transposed else plain
        if stored != delta_shape:
            layout = " (fan_in_fan_out)" if fan_in_fan_out and not embedding else ""
            raise SpecboundError(
                f"the LoRA update of {module} in {folder} is {delta_shape}{layout} but the base's {target} is "
                f"{stored}: the adapter was trained on another model (or fan_in_fan_out is "
                f"wrong); pass its base with --base BASE"
            )
        alpha = float(alpha_patterns.value(module, cfg["lora_alpha"]))
        scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
        if target in updates:
            raise SpecboundError(
                f"{folder} holds two LoRA updates of {target}; re-save the adapter with save_pretrained"
            )
        updates[target] = LoraUpdate(
            target, a_key, b_key, rank, alpha, scale, transposed, replaced.pop(target, None), square
        )
    for target, key in replaced.items():
        updates[target] = LoraUpdate(target, replace_name=key)
    if not any(u.a_name is not None for u in updates.values()):
        raise SpecboundError(
            f"{folder} is {adapter_summary(cfg)} but holds no LoRA factors (lora_A/lora_B); "
            f"re-save the adapter with save_pretrained"
        )
    return updates
