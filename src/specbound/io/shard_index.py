"""The shard index of a sharded checkpoint (``model.safetensors.index.json``,
``pytorch_model.bin.index.json``): its ``weight_map`` from tensor names to shard files."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecboundError
from .base import load_json

FIX = "re-download or re-save the checkpoint"


def read_weight_map(index: Path) -> dict[str, Path]:
    """Tensor name -> shard file of the index ``index``; every shard it names must exist in its folder."""
    folder = index.parent
    weight_map = check_weight_map(
        load_json(index, "shard index", f"expected a JSON object with a 'weight_map'; {FIX}"), index
    )
    outside = sorted({shard for shard in weight_map.values() if not _inside(folder, shard)})
    if outside:
        raise SpecboundError(
            f"the shard index {index} names shard file(s) outside its folder: {', '.join(outside[:3])}; "
            f"a shard index may only name files in {folder} (re-save the checkpoint)"
        )
    missing = sorted({shard for shard in weight_map.values() if not (folder / shard).is_file()})
    if missing:
        names = [n for n, shard in weight_map.items() if shard == missing[0]]
        raise SpecboundError(
            f"the shard index {index} names {len(missing)} shard file(s) missing from {folder}: "
            f"{', '.join(missing)} (holding e.g. {names[0]!r}); download every shard the index "
            f"lists, or re-save the checkpoint"
        )
    return {name: folder / shard for name, shard in weight_map.items()}


def check_weight_map(doc, index) -> dict[str, str]:
    """The ``weight_map`` of a decoded shard index ``doc`` (read from ``index``, a path or a URL):
    tensor names to shard file names, both non-empty strings."""
    if not isinstance(doc, dict) or "weight_map" not in doc:
        found = "an object without one" if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        raise SpecboundError(
            f"cannot read the shard index {index}: expected a JSON object with a 'weight_map', found {found}; {FIX}"
        )
    weight_map = doc["weight_map"]
    bad = (None if isinstance(weight_map, dict) else type(weight_map).__name__) or next(
        (f"{k!r}: {v!r}" for k, v in weight_map.items() if not (isinstance(k, str) and isinstance(v, str) and v)), None
    )
    if bad is not None:
        raise SpecboundError(
            f"the shard index {index} is malformed: its 'weight_map' must map tensor names to shard "
            f"file names, found {bad[:100]}; {FIX}"
        )
    return weight_map


def _inside(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` resolves (symlinks followed) to a path inside ``folder``; in a
    Hugging Face cache snapshot (``<repo>/snapshots/<commit>``), whose files are links into
    ``<repo>/blobs``, a name without ``..`` that resolves into that blobs folder is inside too."""
    if inside(folder, folder / name):
        return True
    plain = not Path(name).is_absolute() and ".." not in Path(name).parts
    return plain and folder.parent.name == "snapshots" and inside(folder.parent.parent / "blobs", folder / name)


def inside(folder: Path, path: Path) -> bool:
    """Whether ``path`` resolves (symlinks followed) to ``folder`` or a path inside it: the one
    check that confines every path a file names (shard indexes, ONNX external data, cache refs)."""
    try:
        root, target = folder.resolve(), path.resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte: nothing to follow
        return False
    return target == root or root in target.parents
