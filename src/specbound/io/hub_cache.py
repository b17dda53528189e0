"""Hub ids resolved from the local Hugging Face cache; one not cached is fetched (:mod:`.hub_fetch`).

The cache layout (``huggingface_hub``): ``<cache>/models--<org>--<name>/refs/<revision>`` holds a
commit hash and ``snapshots/<hash>/`` the files.  The cache is ``$HF_HUB_CACHE`` (or the older
``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``, as ``huggingface_hub`` finds it.

Where ``huggingface_hub`` is installed, its own offline lookup (``snapshot_download(...,
local_files_only=True)``) resolves the revision first, so tags, ``refs/pr/N`` and any future cache
layout are read as the hub library reads them; this module's own reading of the layout is the
fallback (no ``huggingface_hub``, or a revision it cannot resolve offline, e.g. a commit prefix).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import SpecboundError
from .base import load_json, read_regular_file
from .hub_fetch import fetch_hub_id, offline
from .shard_index import inside

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?$")
# What a snapshot folder may be named: a commit hash (or a prefix), one path component.
_COMMIT = re.compile(r"^[\w-][\w.-]{0,99}$")


def cache_dir() -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def looks_like_hub_id(source: str) -> bool:
    return bool(HUB_ID.match(source))


def repo_folder(repo_id: str, cache: Path | None = None) -> Path:
    return (cache_dir() if cache is None else cache) / ("models--" + repo_id.replace("/", "--"))


def cached_model_ids(cache: Path | None = None) -> list[str]:
    """Hub ids (``org/name``) of the model repositories in the local cache."""
    cache = cache_dir() if cache is None else cache
    if not cache.is_dir():
        return []
    return sorted(
        e.name[len("models--") :].replace("--", "/")
        for e in cache.iterdir()
        if e.name.startswith("models--") and e.is_dir()
    )


def confined_snapshots(repo_id: str, cache: Path | None = None) -> Path:
    """``<cache>/models--<org>--<name>/snapshots``, checked (symlinks followed) to stay inside the
    cache: a repository folder or ``snapshots`` folder that links elsewhere is refused before it is
    listed or read (its listing and files are not the cache's)."""
    cache = cache_dir() if cache is None else cache
    repo = repo_folder(repo_id, cache)
    snapshots = repo / "snapshots"
    for folder, parent in ((repo, cache), (snapshots, repo)):
        if folder.exists() and not inside(parent, folder):
            raise SpecboundError(
                f"the cache entry {folder} of {repo_id} is a link leading out of {parent}; a Hugging "
                f"Face cache entry holds its own files: remove the link and download the model again"
            )
    return snapshots


def find_snapshot(repo_id: str, revision: str = "main", cache: Path | None = None) -> Path | None:
    """The snapshot folder of ``repo_id`` at ``revision`` (a ref such as ``main``, or a commit hash
    or its prefix); for ``main`` with no ref, the only snapshot there is.  None when absent; an
    error when several snapshots could be meant."""
    repo = repo_folder(repo_id, cache)
    snapshots = confined_snapshots(repo_id, cache)
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / revision
    if not inside(repo / "refs", ref):
        raise SpecboundError(
            f"revision {revision!r} of {repo_id} leaves the cache's refs folder; pass a branch, tag or commit hash"
        )
    commit = read_ref(repo_id, revision, repo.parent) or revision
    if not _COMMIT.match(commit):
        if not ref.is_file():
            return None  # a revision that is no ref here and cannot be a snapshot's name: not cached
        raise SpecboundError(
            f"{ref} names {commit[:60]!r}, not a commit hash; the cache entry {repo} is "
            f"corrupt: download the model again"
        )
    if (snapshots / commit).is_dir() and inside(snapshots, snapshots / commit):
        return snapshots / commit
    found = sorted(p for p in snapshots.iterdir() if p.is_dir() and inside(snapshots, p))
    matches = [p for p in found if p.name.startswith(commit)]
    if len(matches) == 1:
        return matches[0]
    if revision == "main" and not ref.is_file() and len(found) == 1:
        return found[0]
    if revision == "main" and not ref.is_file() and len(found) > 1:
        raise SpecboundError(
            f"{repo_id} has {len(found)} snapshots in {repo} and no refs/main: pass {repo_id}@<commit> for "
            f"one of them ({', '.join(p.name[:12] for p in found)})"
        )
    return None


MAX_REF_BYTES = 4096  # a ref holds a 40-character commit hash
MAX_SNAPSHOT_ENTRIES = 100_000  # files of one snapshot folder checked for links out of the cache


def read_ref(repo_id: str, revision: str, cache: Path) -> str | None:
    """The commit ``refs/<revision>`` of ``repo_id`` names (None when there is no such ref), read as
    a regular file of at most ``MAX_REF_BYTES`` (a FIFO would block the read, ``/dev/zero`` never end
    it): this runs before ``huggingface_hub``'s offline lookup opens the same file."""
    repo = repo_folder(repo_id, cache)
    ref = repo / "refs" / revision
    if not os.path.lexists(ref):
        return None
    if not inside(repo / "refs", ref):
        raise SpecboundError(
            f"the cache ref {ref} of {repo_id} leads out of the cache's refs folder (a link); "
            f"remove it and download the model again"
        )
    if ref.is_dir():
        return None  # refs/pr holds refs/pr/N: a folder of refs, not one
    fix = f"the cache entry {repo} is corrupt: remove the ref and download the model again"
    data = read_regular_file(ref, MAX_REF_BYTES, "cache ref", fix)
    return data.decode("utf-8", errors="replace").strip()


def check_snapshot_links(snapshot: Path, repo_id: str) -> None:
    """Refuse a snapshot whose files (links into ``blobs/``, as huggingface_hub writes them) resolve
    outside the repository's cache folder: what is read must be what the cache holds."""
    repo = snapshot.parent.parent
    if not inside(repo / "snapshots", snapshot):
        raise SpecboundError(
            f"the snapshot {snapshot} of {repo_id} leads out of the Hugging Face cache; remove "
            f"the link and download the model again"
        )
    count = 0
    for folder, dirs, files in os.walk(snapshot):  # links to folders are listed, never followed
        for name in (*dirs, *files):
            count += 1
            if count > MAX_SNAPSHOT_ENTRIES:
                raise SpecboundError(
                    f"the snapshot {snapshot} of {repo_id} holds more than "
                    f"{MAX_SNAPSHOT_ENTRIES:,} files: not a model's cache entry; pass the model "
                    f"folder you mean"
                )
            path = Path(folder) / name
            if path.is_symlink() and not inside(repo, path):
                raise SpecboundError(
                    f"the cached file {path} of {repo_id} is a link leading out of its cache "
                    f"entry {repo} (to {os.path.realpath(path)[:120]}): refused; remove it and "
                    f"download the model again"
                )


def complete_snapshot(snapshot: Path) -> bool:
    """Whether a cached snapshot holds a model (config.json, or an adapter's adapter_config.json), and
    every shard its shard index names: a fetch that stopped midway (a dropped connection, a refused
    answer) leaves a snapshot folder without them, which the next run fetches again rather than
    reads as the model."""
    if not (snapshot / "config.json").is_file() and not (snapshot / "adapter_config.json").is_file():
        return False
    index = snapshot / "model.safetensors.index.json"
    if not index.is_file():
        return True

    try:
        weight_map = load_json(index, "shard index", "download the model again").get("weight_map")
    except (SpecboundError, AttributeError):
        return True  # a corrupt index: the reader says so
    if not isinstance(weight_map, dict):
        return True
    return all(isinstance(v, str) and (snapshot / v).is_file() for v in set(weight_map.values()))


def hub_library_snapshot(repo_id: str, revision: str, cache: Path) -> Path | None:
    """The snapshot folder ``huggingface_hub`` resolves offline, or None (not installed, or not in
    the cache as it reads it).  Never touches the network (``local_files_only=True``)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        found = snapshot_download(repo_id, revision=revision, cache_dir=str(cache), local_files_only=True)
    except Exception:  # noqa: BLE001  (LocalEntryNotFoundError, a revision it cannot read offline, ...)
        return None
    path = Path(found)
    inside = path.resolve().is_relative_to(cache.expanduser().resolve())  # confined to the cache, as below
    return path if path.is_dir() and inside else None


def resolve_hub_id(source: str, *, stream: bool = False, disk_budget: int | str | None = None):
    """Snapshot folder of ``org/name`` or ``org/name@revision`` (branch, tag, ``refs/pr/N`` or
    commit hash, or its prefix); one not in the cache is fetched, or streamed (``stream``, or over
    ``disk_budget``: then the :class:`~.hub_stream.StreamedCheckpoint`, :func:`.hub_fetch.fetch_hub_id`).
    A snapshot already in the cache is read from there, streamed or not: nothing is downloaded."""
    repo_id, at, revision = source.partition("@")
    if at and not revision.strip():
        raise SpecboundError(
            f"the hub id {source!r} names an empty revision: pass ORG/NAME for the main branch, "
            f"or ORG/NAME@REV with a branch, tag or commit hash"
        )
    revision = revision or "main"
    if ".." in repo_id.split("/") or ".." in revision.split("/") or revision.startswith("/"):
        raise SpecboundError(
            f"the hub id {source!r} has a '..' component: a hub id is org/name[@revision] "
            f"inside the local Hugging Face cache"
        )
    confined_snapshots(repo_id)
    read_ref(repo_id, revision, cache_dir())  # a FIFO or /dev/zero there: refused before huggingface_hub reads it
    found = hub_library_snapshot(repo_id, revision, cache_dir())
    if found is None:
        repo = repo_folder(repo_id)
        found = find_snapshot(repo_id, revision) if repo.is_dir() else None

    if found is not None:
        check_snapshot_links(found, repo_id)
        if offline() or complete_snapshot(found):
            return found  # (offline, an incomplete one says what it lacks)
    repo = repo_folder(repo_id)

    if offline() and repo.is_dir():
        snapshots = confined_snapshots(repo_id)
        present = sorted(p.name[:12] for p in snapshots.iterdir()) if snapshots.is_dir() else []
        raise SpecboundError(
            f"{repo_id} is in the Hugging Face cache ({repo}) but revision {revision!r} is not "
            f"(snapshots present: {present or 'none'}); pass {repo_id}@<commit> for one of them, or unset "
            f"HF_HUB_OFFLINE to {'stream' if stream else 'download'} it"
        )
    return fetch_hub_id(repo_id, revision, cache_dir(), stream=stream, disk_budget=disk_budget)
