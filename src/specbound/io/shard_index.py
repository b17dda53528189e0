"""The shard index of a sharded checkpoint (``model.safetensors.index.json``,
``pytorch_model.bin.index.json``): its ``weight_map`` from tensor names to shard files."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SpecboundError


def read_weight_map(index: Path) -> dict[str, Path]:
    """Tensor name -> shard file of the index ``index``; every shard it names must exist in its folder."""
    folder = index.parent
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise SpecboundError(
            f"cannot read the shard index {index} ({type(exc).__name__}: {exc}): expected a JSON "
            f"object with a 'weight_map'; re-download or re-save the checkpoint"
        ) from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise SpecboundError(
            f"the shard index {index} is malformed: its 'weight_map' must map tensor names to shard "
            f"file names, found {type(weight_map).__name__}; re-download or re-save the checkpoint"
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


def _inside(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` resolves (symlinks followed) to a path inside ``folder``."""
    root = folder.resolve()
    target = (folder / name).resolve()
    return target == root or root in target.parents

