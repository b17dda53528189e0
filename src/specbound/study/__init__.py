"""``specbound study``: does the bound track generalization?  Train small transformers on real data
on the CPU, analyse every checkpoint with :func:`specbound.analyze`, and compare every bound with
the measured generalisation gap (issue #5).

    data.py      the two tasks (Fashion-MNIST; word-level language identification), from Debian packages
    models.py    a small ViT and a small BERT-style encoder, built from transformers configs
    train.py     training, train/test metrics, the margin distribution and the margin used
    grid.py      RunConfig (hashed into the run's key) and the default / quick grids
    runs.py      one atomically written folder per run: the resumable record store
    pipeline.py  run_study: workers, threads, the stages in order
    table.py     records -> one row per run with every measure
    correlate.py Kendall's tau, overall and granulated (Jiang et al. 2020)
    report.py    Markdown/CSV tables and figures

Only ``models.py`` and ``train.py`` import torch/transformers, and only worker processes import them.
"""

__all__ = ["run_study"]


def __getattr__(name):  # lazy, like the top-level package
    if name == "run_study":
        from .pipeline import run_study

        return run_study
    raise AttributeError(f"module 'specbound.study' has no attribute {name!r}")
