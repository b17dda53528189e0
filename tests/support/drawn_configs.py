"""Tiny ``transformers`` models of configurations drawn by hypothesis, saved and analysed
(tests/archs/test_frontier_configs.py, tests/archs/test_moe_latent_configs.py).

A case is ``(family, common, extra)``: the family's name and two dicts of config keywords; ``classes``
maps a family to the names of its ``transformers`` model and config classes.
"""

from __future__ import annotations

import math

from hypothesis import given, settings

import specbound


def check_drawn(strategy, check, *, examples: int = 2) -> None:
    """``check(case)`` on ``examples`` cases drawn from ``strategy``, the same ones every run."""

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None)
    @given(case=strategy)
    def run(case):
        check(case)

    run()


def analysed(case, classes: dict, tmp_path_factory):
    """``(model, analysis)`` of ``case``: the model built from its config (torch seed 0), saved in a fresh
    folder and analysed with one thread; asserts the analysis names the family and its bound is finite."""
    import torch
    import transformers

    family, common, extra = case
    transformers.logging.set_verbosity_error()
    model_cls, config_cls = classes[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**common, **extra))
    folder = tmp_path_factory.mktemp(family)
    model.save_pretrained(folder)
    a = specbound.analyze(folder, threads=1)
    assert a.model["family"] == family and math.isfinite(a.bounds["spectral_adaptive"])
    return model, a
