"""Hub ids resolved offline from the local Hugging Face cache; nothing is ever downloaded.

The cache layout (``huggingface_hub``): ``<cache>/models--<org>--<name>/refs/<revision>`` holds a
commit hash and ``snapshots/<hash>/`` the files.  The cache is ``$HF_HUB_CACHE``, else
``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import SpecboundError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?$")


def cache_dir() -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def looks_like_hub_id(source: str) -> bool:
    return bool(HUB_ID.match(source))


def resolve_hub_id(source: str) -> Path:
    """Snapshot folder of ``org/name`` or ``org/name@revision`` (branch, tag or commit hash)."""
    repo_id, _, revision = source.partition("@")
    revision = revision or "main"
    cache = cache_dir()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    hint = (f"download it on a connected machine (huggingface-cli download {repo_id}) and copy the "
            f"cache folder {repo.name} into {cache}, or pass a local model folder")
    if not repo.is_dir():
        raise SpecboundError(
            f"checkpoint not found: {source!r} is neither an existing path nor a model in the local "
            f"Hugging Face cache (looked for {repo}); specbound never downloads: {hint}"
        )
    snapshots = repo / "snapshots"
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    if (snapshots / commit).is_dir():
        return snapshots / commit
    matches = sorted(p for p in snapshots.glob(f"{commit}*") if p.is_dir()) if snapshots.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    present = sorted(p.name[:12] for p in snapshots.iterdir()) if snapshots.is_dir() else []
    raise SpecboundError(
        f"{repo_id} is in the Hugging Face cache ({repo}) but revision {revision!r} is not "
        f"(snapshots present: {present or 'none'}); pass {repo_id}@<commit> for one of them, or {hint}"
    )
