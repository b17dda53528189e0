"""A BERT-Miniatures-shaped family of random checkpoints, to try sweeps offline.

The BERT Miniatures (Turc et al., 2019, arXiv:1908.08962; the family of the paper's experiment)
are 24 BERT models, ``L in {2, 4, 6, 8, 10, 12}`` by ``N in {128, 256, 512, 768}``, with ``H = N/64``
heads of size 64 and ``d_ff = 4N``, published as ``google/bert_uncased_L-{L}_H-{N}_A-{H}``.  They
cannot be downloaded here, so :func:`write_miniatures` writes random checkpoints of the same 24
shapes (BERT's initialiser, std 0.02; see :func:`specbound.tools.synthetic.write_bert_checkpoint`), either as
a Hugging Face cache (``layout="hf-cache"``: point ``HF_HUB_CACHE`` at the folder and the hub ids
resolve to them, so a sweep written for the real models runs unchanged) or as plain folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import SpecboundError
from .synthetic import write_bert_checkpoint

DEPTHS = (2, 4, 6, 8, 10, 12)
WIDTHS = (128, 256, 512, 768)
HEAD_SIZE = 64
HUB_PATTERN = "google/bert_uncased_L-{2..12}_H-{128..768}_A-{H/64}"
LAYOUTS = ("hf-cache", "folders")


def miniature_name(L: int, N: int, head_size: int = HEAD_SIZE) -> str:
    """``bert_uncased_L-{L}_H-{N}_A-{N / head_size}``, the Miniatures' naming."""
    return f"bert_uncased_L-{L}_H-{N}_A-{N // head_size}"


def write_miniatures(
    root: str | Path,
    *,
    layout: str = "hf-cache",
    depths=DEPTHS,
    widths=WIDTHS,
    head_size: int = HEAD_SIZE,
    vocab: int = 512,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write one random BERT checkpoint per ``(L, N)`` in ``depths x widths`` under ``root``.

    Parameters
    ----------
    root : path
        ``layout="hf-cache"``: a hub cache folder, ``models--google--bert_uncased_L-2_H-128_A-2/``
        with ``refs/main`` and ``snapshots/<revision>/{config.json, model.safetensors}``;
        ``layout="folders"``: ``root/bert_uncased_L-2_H-128_A-2/`` and so on.
    depths, widths : sequences of int
        Default: the 24 Miniatures shapes.
    head_size : int
        ``H = N / head_size`` heads; ``d_ff = 4 N``.
    vocab : int
        Embedding rows (the real models have 30522; the bounds never read embeddings).
    seed : int
        Each checkpoint's weights come from ``seed``, ``L`` and ``N``, so the family is reproducible.
    progress : callable(name), optional
        Called after each checkpoint is written.

    Returns
    -------
    list of Path
        The model folders written (the snapshot folders for the cache layout).
    """
    if layout not in LAYOUTS:
        raise SpecboundError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    root = Path(root).expanduser()
    written = []
    for L in depths:
        for N in widths:
            if N % head_size:
                raise SpecboundError(f"hidden size {N} is not a multiple of the head size {head_size}")
            name = miniature_name(L, N, head_size)
            if layout == "hf-cache":
                repo = root / f"models--google--{name}"
                revision = f"{seed:08x}{L:016x}{N:016x}"  # 40 hex digits, like a commit hash
                folder = repo / "snapshots" / revision
                (repo / "refs").mkdir(parents=True, exist_ok=True)
                (repo / "refs" / "main").write_text(revision)
            else:
                folder = root / name
            write_bert_checkpoint(
                folder, L=L, N=N, H=N // head_size, d_ff=4 * N, vocab=vocab, seed=seed * 1_000_003 + L * 10_007 + N
            )
            written.append(folder)
            if progress:
                progress(name)
    return written
