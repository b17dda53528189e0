"""Stage 9, study (``specbound study``): does the bound track generalization?  Train small transformers on
real data on the CPU to a training criterion, analyse every checkpoint with :func:`specbound.analyze`, and
compare every bound with the measured generalisation gap (docs/study.md).

    data.py      the three tasks (Fashion-MNIST; word-level language identification; fortune topics),
                 from Debian packages; the seed draws the training sample
    models.py    a small ViT and small BERT-style encoders, built from transformers configs
    train.py     training to the criterion, train/test metrics, margins normalised by the observed
                 row norms, PAC-Bayes flatness and inverse margin
    grid.py      RunConfig (hashed into the run's key) and the one-at-a-time default / quick grids
    runs.py      one atomically written folder per run: the resumable record store
    pipeline.py  run_study: worker processes or Dask tasks, the stages in order
    table.py     records -> one row per run with every measure; one row per matrix with its p*
    correlate.py tau, granulated psi, K (Jiang et al. 2020), robust sign-error (Dziugaite et al.
                 2020), bootstrap intervals
    report.py    Markdown/CSV tables and figures
    paper.py     ``specbound paper``: the paper's depth/width figure and growth slopes on a store or a
                 study's runs (the command's engine; it imports no torch)

Only ``models.py`` and ``train.py`` import torch/transformers, and only worker processes import them.
"""

__all__ = ["run_study"]


def __getattr__(name):  # lazy, like the top-level package
    if name == "run_study":
        from .pipeline import run_study

        return run_study
    raise AttributeError(f"module 'specbound.study' has no attribute {name!r}")
