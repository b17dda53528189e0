"""Hub ids not in the local cache, fetched through ``huggingface_hub``: only what the analysis reads.

What is fetched: ``config.json`` and the safetensors weights (``model.safetensors``, or the shard
index ``model.safetensors.index.json`` and the shards it names).  A ``.bin``, ONNX, GGUF, TF or Flax
duplicate beside them is never fetched.  A PEFT adapter repository: ``adapter_config.json`` and
``adapter_model.safetensors`` (its base is fetched as a hub id of its own).  A CTranslate2 repository
(faster-whisper): ``config.json`` and ``model.bin``.  Each file goes through ``hf_hub_download`` into the usual
cache layout, so a later run finds it offline; a dropped connection resumes where it stopped (a
Range request) and the hub library's progress bar shows.

Streamed instead (:mod:`.hub_stream`, nothing downloaded) with ``stream=True`` (``--stream``), or
without asking when those files exceed the disk budget (``--disk-budget``; default: the free space
of the cache's filesystem), which a one-line warning says.

The environment is read at call time (not at ``huggingface_hub``'s import): ``HF_ENDPOINT`` (a
mirror or a local server), ``HF_TOKEN`` (gated or private repositories), ``HF_HUB_OFFLINE`` (never
touch the network); the cache folder (``HF_HUB_CACHE``, ``HF_HOME``) is the caller's
(:func:`.hub_cache.cache_dir`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..errors import SpecboundError
from .hub_errors import display

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # a PEFT adapter repository
CT2_MODEL = "model.bin"  # CTranslate2's weights (never a PyTorch pickle's name: pytorch_model.bin)


def offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _endpoint() -> str | None:
    return (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None  # None: huggingface_hub's own lookup (a stored login)


def needed_files(files: list[str], read_index) -> list[str]:
    """The files of a repository listing (``files``: paths relative to its root) that the analysis
    reads, in download order; ``read_index()`` returns the shard index's ``weight_map`` values.  Raises when the repository holds no config.json or no safetensors."""
    present = set(files)
    if CONFIG not in present and ADAPTER_CONFIG in present:  # a PEFT adapter: merged into its base (io.lora)
        if ADAPTER_WEIGHTS not in present:
            raise SpecboundError(f"a PEFT adapter ({ADAPTER_CONFIG}) without {ADAPTER_WEIGHTS}")
        return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    if CONFIG not in present:
        raise SpecboundError("no config.json")
    if INDEX in present:
        shards = sorted(set(read_index()))
        missing = [s for s in shards if s not in present]
        if missing or not shards:
            raise SpecboundError(f"its {INDEX} names shards the repository does not hold "
                                 f"({', '.join(missing[:3]) or 'none named'})")
        return [CONFIG, INDEX, *shards]
    if SINGLE in present:
        return [CONFIG, SINGLE]
    if CT2_MODEL in present:  # a CTranslate2 repository (faster-whisper): read by io.ctranslate2_file
        return [CONFIG, CT2_MODEL]
    raise SpecboundError("no safetensors weights (" + (", ".join(sorted(f for f in present if "/" not in f)[:6])
                                                       or "no files") + ")")


def parse_size(text: str | int) -> int:
    """Bytes from ``20GB``, ``1.5GiB``, ``500M``, ``1e9`` or an int: decimal units (kB, MB, GB, TB: powers
    of 1000) and binary ones (KiB, MiB, GiB, TiB: powers of 1024); a bare K/M/G/T is decimal."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _SIZE.fullmatch(str(text).strip())
    if match is None:
        raise SpecboundError(f"expected a size in bytes such as 20GB, 500MiB or 1000000000, found {text!r}")
    unit = match.group(2).upper().rstrip("B")
    scale = 1024 ** _UNITS.index(unit[0]) if unit.endswith("I") else 1000 ** _UNITS.index(unit[:1])
    return int(float(match.group(1)) * scale)


_UNITS = ("", "K", "M", "G", "T", "P")
_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*((?:[kKmMgGtTpP]i?)?[bB]?)")


def free_disk(cache: Path) -> int | None:
    """Free bytes on the filesystem of ``cache`` (its nearest existing ancestor), None when unknown."""
    for folder in (cache, *cache.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def fetch_hub_id(repo_id: str, revision: str, cache: Path, *, stream: bool = False,
                 disk_budget: int | str | None = None):
    """Download what the analysis needs of ``repo_id`` at ``revision`` into ``cache``: the snapshot
    folder holding it.  With ``stream``, or when those files exceed ``disk_budget`` bytes (default:
    the free space of the cache's filesystem), nothing is downloaded: the
    :class:`~.hub_stream.StreamedCheckpoint` reading them by byte ranges (the automatic case says so
    in a :class:`~specbound.errors.SpecboundWarning`).  Every failure is a one-line SpecboundError
    with the fix."""
    name = display(repo_id, revision)
    budget = None if disk_budget is None else parse_size(disk_budget)
    if offline():
        if stream:
            raise SpecboundError(f"--stream reads {name} over the network and HF_HUB_OFFLINE is set: unset "
                                 f"HF_HUB_OFFLINE, or pass a model folder or a hub id in the local cache")
        raise SpecboundError(f"{name} is not in the local Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
                             f"is set: unset HF_HUB_OFFLINE to download it, or pass a local model folder")
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise SpecboundError(f"{name} is not in the local Hugging Face cache and huggingface_hub is not "
                             f"installed to fetch it: pip install huggingface_hub") from None
    from .hub_errors import hub_errors
    from .hub_stream import HubFiles, open_streamed, read_json_weight_map

    endpoint, token = _endpoint(), _token()

    with hub_errors(repo_id, revision, _endpoint()):
        info = HfApi(endpoint=endpoint, token=token).model_info(repo_id, revision=revision, files_metadata=True)
        sizes = {s.rfilename: s.size for s in info.siblings or []}
        remote = HubFiles(repo_id, revision, info.sha or revision, endpoint, token)  # every read at one commit
        weight_map = read_json_weight_map(remote) if INDEX in sizes and CONFIG in sizes else None
        try:
            wanted = needed_files(list(sizes), lambda: list(weight_map.values()))
        except SpecboundError as e:
            raise SpecboundError(f"the hub model {name} holds {e}: specbound reads only config.json and "
                                 f"safetensors weights; download it yourself and pass the folder") from None
        if not stream:
            stream = _over_budget(name, [sizes[f] for f in wanted], budget, cache)
        if stream and CT2_MODEL in wanted:
            raise SpecboundError(f"{name} is a CTranslate2 model (model.bin), which is read from disk, never "
                                 f"streamed: leave --stream out, or raise --disk-budget to download it")
        if stream:
            return open_streamed(remote, weight_map)
        paths = [Path(hf_hub_download(repo_id, f, revision=remote.commit, cache_dir=str(cache), endpoint=endpoint,
                                      token=token)) for f in wanted]
    return paths[0].parent


def _over_budget(name: str, sizes: list[int | None], budget: int | None, cache: Path) -> bool:
    """Whether files of ``sizes`` bytes exceed ``budget`` (None: the free space of the cache's
    filesystem); said in one line when they do.  Unknown sizes or free space: they fit."""
    room = free_disk(cache) if budget is None else budget
    if room is None or None in sizes or sum(sizes) <= room:
        return False
    import warnings

    from ..errors import SpecboundWarning

    where = f" free in {cache}" if budget is None else ""
    warnings.warn(SpecboundWarning(
        f"the weights of {name} ({sum(sizes) / 1e9:.2f} GB) exceed the disk budget ({room / 1e9:.2f} GB{where}): "
        f"streaming them by HTTP range requests instead of downloading (--disk-budget sets the budget)"), stacklevel=4)
    return True


def _is_shard(filename: str) -> bool:
    """A sharded safetensors file at the repository's root (``model-00001-of-00004.safetensors``)."""
    return "/" not in filename and filename.endswith(".safetensors") and filename != SINGLE
