"""The base of every checkpoint format: a model's config and its weight tensors, read on demand,
one at a time, upcast to float64 and checked for NaN/Inf (one module per format beside this one;
:mod:`specbound.io.dispatch` picks the format)."""

from __future__ import annotations

import json
import math
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError, os_errors, oversized_integer_text

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# Bytes per stored value, by safetensors dtype code; an unknown code counts as 1 (the least a
# declared value can take, so the size check never refuses a tensor that could fit).
_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E8M0": 1,
}
# JSON nesting beyond this is refused before parsing (Python's parser recurses once per level, and
# a real config.json or shard index is a few levels deep).
MAX_JSON_DEPTH = 200


# The note of a reader whose weights are not the stored values as trained (a quantized checkpoint: the values
# dequantized, so the bounds are of the quantized model): listed first among the assumptions.
WEIGHTS_NOTE = "quantized_weights"


@dataclass(frozen=True)
class ReaderFacts:
    """What a reader found out about a checkpoint beyond its tensors and config, each with its default (a float
    safetensors folder's); a wrapper forwards its inner checkpoint's whole (:meth:`Checkpoint.forward_facts`)."""

    # The config.json the config was read from (None: an in-memory model, a GGUF file, or a config rebuilt
    # from the weights); set by open_checkpoint, read again by a sweep.
    config_path: Path | None = None
    # ``ORG/NAME@commit`` for a hub id (fetched, cached or streamed): the analysis's source, while
    # ``location`` stays the snapshot folder it was read from; None for anything else.
    hub_source: str | None = None
    # Name -> one sentence, for what the reader assumed where the file leaves it unstated (a GGUF file's
    # YaRN mscale) and, under WEIGHTS_NOTE, that the weights read are not the stored values as trained;
    # each is one assumption of kind "convention" in the analysis.
    notes: Mapping[str, str] = field(default_factory=dict)
    # Whether the config is rebuilt from the weights file (CTranslate2's model.bin), not read from a config.json
    # beside it: there is then no config_path for a sweep to fingerprint.
    config_from_weights: bool = False
    # Whether the checkpoint came without config.json (an ONNX export on its own): its config is inferred from
    # ``graph_hints`` by archs.graph_config.complete_config.
    needs_config: bool = False
    # The graph's reshape targets, scalars and operators (io.onnx_graph.GraphHints) of such an export; None else.
    graph_hints: Any = None
    # The sentence-transformers modules around the Transformer (io.sentence_modules.SentenceModules) when the
    # folder has modules.json; None else.
    sentence_modules: Any = None


class Checkpoint:
    """A model's config and its weight tensors, read on demand, one at a time.

    Subclasses store the tensors (safetensors files, PyTorch pickles read with
    ``weights_only=True``, an in-memory state dict); this class upcasts and validates them.

    Attributes
    ----------
    location : str
        Human-readable origin.
    config : dict
        Decoded ``config.json`` (or the in-memory model's config).
    """

    location: str
    config: dict[str, Any]
    # What the reader found out beyond the tensors and the config (ReaderFacts); a wrapper (LoRA, quantized)
    # forwards its inner checkpoint's whole, a tower view shares it.
    facts: ReaderFacts = ReaderFacts()
    # Whether :meth:`stored` gives a tensor's stored values in its own dtype (packed quantized parts): the
    # safetensors readers, local and streamed, and the quantized wrapper over them.
    reads_stored: bool = False
    # Layers analysed in parallel threads read one tensor at a time: loaded pickle shards, ONNX
    # graphs and in-memory tensors are shared state.  Safetensors reads open their own file handle
    # and overlap (SafetensorsCheckpoint).
    _read_lock: Any = threading.RLock()

    @property
    def names(self) -> list[str]:
        raise NotImplementedError

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, name: str) -> str:
        """The stored dtype as a safetensors code (``"F32"``, ``"F16"``, ``"BF16"``, ...)."""
        raise NotImplementedError

    def _raw(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def layout(self, name: str) -> str | None:
        """How ``name`` is stored when the format, not the model, decides it: ``"linear"`` for
        ``(out, in)``, ``"conv1d"`` for ``(in, out)`` (an ONNX ``MatMul`` operand). None: as the model
        stores it, so the family spec's layout applies."""
        return None

    def where(self, name: str) -> str:
        """The file (or object) holding ``name``, for messages."""
        return self.location

    def files(self) -> list[Path]:
        """The files holding the weights, sorted (empty for an in-memory model): what a sweep hashes
        into a record's key, and the bytes any declared tensor size must fit in."""
        return []

    def _stored_in(self, name: str) -> Path | None:
        """The file holding ``name``'s bytes (None: in memory, or not one file)."""
        return None

    def check_size(self, name: str) -> int:
        """The number of values of ``name``, checked against what holds it, before anything is
        allocated: the one place every declared size is bounded.

        A checkpoint's header, pickle or graph declares each tensor's shape; a hostile or corrupt
        one may declare 10^12 values in a 2 kB file (a lying header, a stride-0 pickled tensor).
        The stored values must fit in the file that holds them (the weight files together, when
        the format does not say which one), and their float64 copy in the memory available now.
        """
        shape = self.shape(name)
        if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} declares the shape {shape}: expected "
                f"non-negative integer dimensions; the checkpoint is corrupt, re-save it"
            )
        count = math.prod(int(d) for d in shape)
        stored = count * _ITEMSIZE.get(self.dtype(name), 1)
        # A missing file is left to the reader, whose message says which file and why.
        holders = [self._stored_in(name)] if self._stored_in(name) is not None else self.files()
        with os_errors(f"check the size of {self.where(name)}"):
            held = sum(p.stat().st_size for p in holders if p.is_file()) if any(p.is_file() for p in holders) else None
        if held is not None and stored > held:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} declares the shape {tuple(int(d) for d in shape)} "
                f"({stored:,} bytes as {self.dtype(name)}) but its file holds {held:,} bytes: the header or "
                f"pickle lies about the tensor's size (a corrupt or hostile file); re-save the checkpoint"
            )
        return self.check_memory(name, count)

    def check_memory(self, name: str, count: int) -> int:
        """``count``: the values of ``name``, whose float64 copy must fit in the memory available now
        (the check every reader's :meth:`check_size` ends with)."""
        free = available_memory()
        if free is not None and 8 * count > free:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} has {count:,} values: its float64 copy needs "
                f"{8 * count / 2**30:.1f} GiB and {free / 2**30:.1f} GiB of memory is available; use a "
                f"machine with more memory"
            )
        return count

    def read(self, name: str, *, compact: bool = False) -> np.ndarray:
        """The tensor ``name`` as a float64 array; NaN/Inf is an error naming the tensor.

        Floating-point tensors (F64, F32, F16, BF16) are upcast exactly; any other dtype (integer,
        8-bit float: a quantized checkpoint) is an error, since its stored values are not the weights.
        ``compact``: a format that can (:meth:`_raw_compact`) gives an F32, F16 or BF16 tensor as float32,
        which holds it exactly in half the memory; float64 otherwise.
        """
        with self._read_lock, os_errors(f"read tensor {name!r} from {self.where(name)}"):
            dtype = self.dtype(name)
            if dtype in FLOAT_DTYPES:
                self.check_size(name)
            small = self._raw_compact(name) if compact and dtype in FLOAT_DTYPES else None
            raw = small if small is not None else self._raw(name) if dtype in FLOAT_DTYPES else None
        if raw is None:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} is stored as {dtype}, not as a floating-point weight "
                f"({', '.join(FLOAT_DTYPES)}): a quantized checkpoint's stored values are not its "
                f"weights; dequantize it and save it in float16/bfloat16/float32 first"
            )
        array = raw if small is not None else np.asarray(raw, dtype=np.float64)
        # A NaN or an infinity makes the sum non-finite, so a finite sum clears the tensor in one
        # pass without a mask; a non-finite sum (or an overflow of huge finite values) is counted.
        with np.errstate(over="ignore", invalid="ignore"):
            total = array.sum()
        bad = 0 if np.isfinite(total) else int(np.count_nonzero(~np.isfinite(array)))
        if bad:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} holds {bad} NaN/Inf value(s); the bounds are undefined "
                f"for non-finite weights: re-export the checkpoint from a healthy training state"
            )
        return array

    def read_part(self, name: str, index: int) -> np.ndarray:
        """``read(name)[index]``: one expert of an expert bank (every expert's matrix along the tensor's
        first axis: gpt-oss, Llama 4), float64, checked like :meth:`read`.  A format that can read the
        part alone (:meth:`_raw_part`) reads only its bytes, so a bank of 128 experts is never held whole."""
        shape = self.shape(name)
        if not shape or not 0 <= index < int(shape[0]):
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} has shape {tuple(shape)}: it holds no "
                f"part {index} along its first axis"
            )
        with self._read_lock, os_errors(f"read part {index} of tensor {name!r} from {self.where(name)}"):
            raw = self._raw_part(name, index) if self.dtype(name) in FLOAT_DTYPES else None
        if raw is None:
            return self.read(name)[index]  # the whole tensor's checks and messages
        array = np.asarray(raw, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            total = array.sum()
        if not np.isfinite(total) and np.count_nonzero(~np.isfinite(array)):
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} holds {int(np.count_nonzero(~np.isfinite(array)))} NaN/Inf "
                f"value(s) in part {index}; the bounds are undefined for non-finite weights: re-export the "
                f"checkpoint from a healthy training state"
            )
        return array

    def _raw_compact(self, name: str) -> np.ndarray | None:
        """The values of ``name`` as float32 when that holds them exactly and the format reads them so
        without a float64 copy; None (the default: read as float64) otherwise."""
        return None

    def _raw_part(self, name: str, index: int) -> np.ndarray | None:
        """The stored values of ``name[index]`` alone, or None when the format reads whole tensors only."""
        return None

    def stored(self, name: str) -> np.ndarray:
        """The stored values of ``name`` in their own dtype (packed quantized parts), for a reader that
        :attr:`reads_stored`."""
        raise NotImplementedError(f"{type(self).__name__} does not read stored values")

    def set_facts(self, **found: Any) -> None:
        """Add what the opener found (the config.json read, the hub source, the sentence-transformers modules)
        to :attr:`facts`."""
        self.facts = replace(self.facts, **found)

    def forward_facts(self, inner: Checkpoint, **own: Any) -> None:
        """Take ``inner``'s :attr:`facts` whole, as a wrapper of it; ``own``: the facts the wrapper states
        itself (a LoRA adapter's source, a quantized model's note)."""
        self.facts = replace(inner.facts, **own)

    def close(self) -> None:
        """Release open files and cached shards."""


def fingerprint(path: Path) -> str:
    """Where a file is and which version of it: real path, size, mtime, ctime (ns) and inode.

    The ctime is what makes it trustworthy: any write, truncation or ``utime`` sets it to the
    current time and no user can set it back, so a same-size rewrite that restores the old mtime
    still changes the fingerprint (on file systems with nanosecond timestamps: ext4, XFS, btrfs,
    tmpfs, ZFS; a coarser one could miss a rewrite within its tick).
    """
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


class ShardedCheckpoint(Checkpoint):
    """A checkpoint whose tensors lie in files named by a ``shards`` map (tensor name -> file): the
    safetensors and PyTorch formats."""

    shards: dict[str, Path]

    @property
    def names(self) -> list[str]:
        return sorted(self.shards)

    def where(self, name: str) -> str:
        return str(self.shards[name])

    def files(self) -> list[Path]:
        return sorted(set(self.shards.values()))

    def _stored_in(self, name: str) -> Path | None:
        return self.shards[name]


def available_memory() -> int | None:
    """Bytes of memory available to new work (``MemAvailable``), None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# The largest JSON document read (config.json, a shard index: kilobytes; an LLM's index: megabytes).
MAX_JSON_BYTES = 256 << 20
# The largest small file read (config.json, adapter_config.json, towers.json, modules.json, a
# --config file: kilobytes; a config with a large vocabulary map or many layer types: well under this).
MAX_SMALL_FILE_BYTES = 16 << 20


def read_regular_file(
    path: Path, limit: int = MAX_SMALL_FILE_BYTES, what: str = "file", fix: str = "pass a regular file"
) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes: checked with
    ``stat`` before it is opened (a FIFO would block the read, ``/dev/zero`` never end it), and read
    no further than ``limit`` (a file that grows meanwhile).  The one reader of every small file
    (configs, adapter configs, ``towers.json``, ``modules.json``, metrics, store records); every
    failure is one line naming ``what`` the file is and how to ``fix`` it."""
    path = Path(path)
    with os_errors(f"read the {what} {path}"):
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise SpecboundError(f"the {what} {path} is not a regular file (a FIFO, a device or a folder); {fix}")
        if info.st_size > limit:
            raise SpecboundError(
                f"the {what} {path} is {info.st_size:,} bytes, more than any {what} holds ({limit:,}); {fix}"
            )
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    if len(data) > limit:
        raise SpecboundError(f"the {what} {path} grew past {limit:,} bytes while it was read; {fix}")
    return data


def load_json(path: Path, what: str, fix: str, limit: int = MAX_JSON_BYTES) -> Any:
    """``path`` decoded as JSON; any failure (not a regular file, more than ``limit`` bytes,
    unreadable, not UTF-8, not JSON, nested deeper than ``MAX_JSON_DEPTH``, an integer of more than
    4,300 digits) is a one-line error naming ``what`` it is and how to ``fix`` it."""
    return decode_json(read_regular_file(path, limit, what, fix), f"the {what} {path}", fix)


def decode_json(data: bytes, where: str, fix: str) -> Any:
    """``data`` (at most ``MAX_JSON_BYTES``, from a file or an HTTP response) decoded as UTF-8 JSON
    nested at most ``MAX_JSON_DEPTH`` levels; a failure is a one-line error naming ``where`` it
    came from and how to ``fix`` it."""
    try:
        text = data.decode("utf-8")
        if _json_depth(text) > MAX_JSON_DEPTH:
            raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
        return json.loads(text)
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's int-string limit (errors.MAX_INT_DIGITS)
            raise oversized_integer_text(f"read {where}", fix) from None
        raise SpecboundError(f"cannot read {where} as JSON ({type(exc).__name__}: {str(exc)[:200]}); {fix}") from None
    except RecursionError as exc:
        raise SpecboundError(f"cannot read {where} as JSON ({type(exc).__name__}: {str(exc)[:200]}); {fix}") from None


def _json_depth(text: str) -> int:
    """An upper bound of the nesting depth of a JSON text (brackets inside strings count too), or 0
    when it has too few brackets to exceed ``MAX_JSON_DEPTH``; without recursion, so a deeply nested
    document is refused before the recursive parser sees it."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # the usual case, counted in C
        return 0
    depth = best = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def read_config(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "config.json"
    if cfg_path.is_dir() or not cfg_path.exists():
        raise SpecboundError(
            f"{folder} has no config.json: a Hugging Face model folder needs config.json beside "
            f"its weights (save the model with save_pretrained)"
        )
    return check_config(
        load_json(cfg_path, "model config", "re-save the model with save_pretrained", MAX_SMALL_FILE_BYTES), cfg_path
    )


def check_config(config: Any, where: Any) -> dict[str, Any]:
    """A decoded config.json, which must be a JSON object."""
    if not isinstance(config, dict):
        raise SpecboundError(f"{where} must hold a JSON object, found {type(config).__name__}")
    return config
