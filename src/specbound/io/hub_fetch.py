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
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import SpecboundError, SpecboundWarning, os_errors
from .hub_answers import check_commit, check_filename, check_siblings, guarded
from .hub_errors import display, hub_errors, hub_logging
from .hub_stream import HubFiles, open_streamed, read_json_weight_map
from .shard_index import inside

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
DOWNLOAD_WORKERS = 8  # files downloaded at once (huggingface_hub's snapshot_download uses 8 too)
# Shard files an index may name for a hub fetch or stream: published models have a few hundred at most
# (DeepSeek-V3 163, Llama 3.1 405B 191); each shard costs huggingface_hub's per-file round trips
# (docs/hub-and-adapters.md, "Many small shards")
MAX_SHARDS = 1000
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
    reads, in download order; ``read_index()`` returns the shard index's ``weight_map`` values.  Raises when the
    repository holds no config.json or no safetensors."""
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
            raise SpecboundError(
                f"its {INDEX} names shards the repository does not hold ({', '.join(missing[:3]) or 'none named'})"
            )
        return [CONFIG, INDEX, *shards]
    if SINGLE in present:
        return [CONFIG, SINGLE]
    if CT2_MODEL in present:  # a CTranslate2 repository (faster-whisper): read by io.ctranslate2_file
        return [CONFIG, CT2_MODEL]
    raise SpecboundError(
        "no safetensors weights (" + (", ".join(sorted(f for f in present if "/" not in f)[:6]) or "no files") + ")"
    )


def parse_size(text: str | int) -> int:
    """Bytes from ``20GB``, ``1.5GiB``, ``500M``, ``1e9`` or an int: decimal units (kB, MB, GB, TB: powers
    of 1000) and binary ones (KiB, MiB, GiB, TiB: powers of 1024); a bare K/M/G/T is decimal."""
    if isinstance(text, int) and not isinstance(text, bool) and 0 <= text <= MAX_BUDGET:
        return text
    match = _SIZE.fullmatch(str(text).strip())
    if match is None:
        raise SpecboundError(f"expected a size in bytes such as 20GB, 500MiB or 1000000000, found {text!r}")
    unit = match.group(2).upper().rstrip("B")
    scale = 1024 ** _UNITS.index(unit[0]) if unit.endswith("I") else 1000 ** _UNITS.index(unit[:1])
    value = float(match.group(1)) * scale
    if not value <= MAX_BUDGET:  # 1e400 is inf; inf and nan are no number of bytes
        raise SpecboundError(
            f"the size {text!r} is more bytes than any disk holds (at most {MAX_BUDGET:.0e}): "
            f"pass a size such as 20GB, 500MiB or 1000000000"
        )
    return int(value)


MAX_BUDGET = 1e21  # bytes (a zettabyte): any larger size is a mistake, not a disk


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


def fetch_hub_id(
    repo_id: str, revision: str, cache: Path, *, stream: bool = False, disk_budget: int | str | None = None
):
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
            raise SpecboundError(
                f"--stream reads {name} over the network and HF_HUB_OFFLINE is set: unset "
                f"HF_HUB_OFFLINE, or pass a model folder or a hub id in the local cache"
            )
        raise SpecboundError(
            f"{name} is not in the local Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
            f"is set: unset HF_HUB_OFFLINE to download it, or pass a local model folder"
        )
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise SpecboundError(
            f"{name} is not in the local Hugging Face cache and huggingface_hub is not "
            f"installed to fetch it: pip install huggingface_hub"
        ) from None

    endpoint, token = _endpoint(), _token()
    host = endpoint or "huggingface.co"

    with hub_errors(repo_id, revision, endpoint), guarded(host) as expected_sizes, hub_logging():
        info = _model_info(HfApi(endpoint=endpoint, token=token), repo_id, revision, host)
        commit = check_commit(info.sha, host, "the commit (model_info 'sha')")
        sizes = check_siblings(info.siblings, host)
        expected_sizes.update(sizes)
        remote = HubFiles(repo_id, revision, commit, endpoint, token)  # every read at one commit
        remote._sizes.update({f: n for f, n in sizes.items() if n is not None})  # no HEAD per file to stream
        weight_map = read_json_weight_map(remote) if INDEX in sizes and CONFIG in sizes else None
        shards = len(set(weight_map.values())) if isinstance(weight_map, dict) else 0
        if shards > MAX_SHARDS:
            raise SpecboundError(
                f"the hub model {name}'s {INDEX} names {shards:,} shard files; specbound fetches or "
                f"streams at most {MAX_SHARDS:,} (published models have a few hundred at most): "
                f"download it yourself (`hf download {repo_id}`) and pass the folder"
            )
        try:
            wanted = needed_files(
                list(sizes), lambda: [check_filename(v, host, "a shard name of the index") for v in weight_map.values()]
            )
        except SpecboundError as e:
            if str(e).startswith("the hub server "):
                raise
            raise SpecboundError(
                f"the hub model {name} holds {e}: specbound reads only config.json and "
                f"safetensors weights; download it yourself and pass the folder"
            ) from None
        if not stream:
            stream = _over_budget(name, [sizes[f] for f in wanted], budget, cache)
        if stream and CT2_MODEL in wanted:
            raise SpecboundError(
                f"{name} is a CTranslate2 model (model.bin), which is read from disk, never "
                f"streamed: leave --stream out, or raise --disk-budget to download it"
            )
        if stream:
            return open_streamed(remote, weight_map, sizes)

        def download(filename: str) -> Path:
            with guarded(host) as checked:  # (each worker thread checks the answers it gets)
                checked.update(sizes)
                return Path(
                    hf_hub_download(
                        repo_id, filename, revision=commit, cache_dir=str(cache), endpoint=endpoint, token=token
                    )
                )

        if len(wanted) <= 2:
            paths = [download(f) for f in wanted]
        else:  # thousands of small shards: their round trips overlap, as huggingface_hub's snapshot_download does
            with ThreadPoolExecutor(min(DOWNLOAD_WORKERS, len(wanted))) as pool:
                paths = list(pool.map(download, wanted))
    snapshot = _repo_folder(repo_id, cache) / "snapshots" / commit
    for path, filename in zip(paths, wanted):
        if path != snapshot / filename:
            raise SpecboundError(
                f"the hub server {host} served {filename} of {name} at another commit than "
                f"{commit} (it named {path.parent.name[:40]!r}): the answers of one analysis "
                f"must be of one commit; check HF_ENDPOINT, or download the model yourself"
            )
    write_ref(_repo_folder(repo_id, cache), revision, commit)
    return snapshot


def _repo_folder(repo_id: str, cache: Path) -> Path:
    """``<cache>/models--<org>--<name>`` (as :func:`.hub_cache.repo_folder`, which imports this module)."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def _model_info(api, repo_id: str, revision: str, host: str):
    """``model_info`` with its files' sizes; an answer huggingface_hub cannot parse (``siblings`` an
    object, a field of the wrong type) is one line, not its traceback."""
    try:
        return api.model_info(repo_id, revision=revision, files_metadata=True)
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        raise SpecboundError(
            f"the hub server {host} answered a malformed model info for {repo_id} "
            f"({type(exc).__name__}: {str(exc)[:80]}): refused; check HF_ENDPOINT, or download "
            f"the model yourself and pass the folder"
        ) from None


def write_ref(repo: Path, revision: str, commit: str) -> None:
    """``<repo>/refs/<revision>`` holding ``commit``, as ``huggingface_hub`` writes it (no newline,
    written to a temporary file and renamed), so that ``transformers`` with ``HF_HUB_OFFLINE=1`` and
    ``scan_cache_dir()`` find what was fetched; nothing for a revision that is the commit itself."""
    if revision == commit:
        return
    refs = repo / "refs"
    ref = refs / revision
    if not inside(refs, ref.parent) or ref.name in ("", ".", ".."):
        raise SpecboundError(
            f"revision {revision!r} of {repo.name} leaves the cache's refs folder; pass a branch, tag or commit hash"
        )

    with os_errors(f"write the cache ref {ref}"):
        ref.parent.mkdir(parents=True, exist_ok=True)
        if not inside(refs, ref.parent):
            raise SpecboundError(f"the cache's refs folder {refs} holds a link leading out of it; remove it")
        if ref.is_file() and not ref.is_symlink() and ref.stat().st_size == len(commit) and ref.read_text() == commit:
            return
        tmp = ref.with_name(f"{ref.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)


def _over_budget(name: str, sizes: list[int | None], budget: int | None, cache: Path) -> bool:
    """Whether files of ``sizes`` bytes exceed ``budget`` (None: the free space of the cache's
    filesystem); said in one line when they do.  Unknown sizes or free space: they fit."""
    room = free_disk(cache) if budget is None else budget
    if room is None or None in sizes or sum(sizes) <= room:
        return False

    where = f" free in {cache}" if budget is None else ""
    warnings.warn(
        SpecboundWarning(
            f"the weights of {name} ({sum(sizes) / 1e9:.2f} GB) exceed the disk budget ({room / 1e9:.2f} GB{where}): "
            f"streaming them by HTTP range requests instead of downloading (--disk-budget sets the budget)"
        ),
        stacklevel=4,
    )
    return True


def _is_shard(filename: str) -> bool:
    """A sharded safetensors file at the repository's root (``model-00001-of-00004.safetensors``)."""
    return "/" not in filename and filename.endswith(".safetensors") and filename != SINGLE
