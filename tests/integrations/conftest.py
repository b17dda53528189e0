"""What the callback tests share: a tiny BERT classifier, a few batches of random tokens, and the
TensorBoard scalars of a run folder read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_models import build_tiny_model
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

STEPS, EVERY = 6, 3


def tiny_classifier():
    """A BertForSequenceClassification with L=2, N=32 (the tests' tiny BERT family)."""

    model = build_tiny_model("bert_cls")
    return model.train()


def token_batches(count: int, *, seed: int = 0, batch: int = 4, length: int = 8):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, 64, (batch, length), generator=g),
            "labels": torch.randint(0, 3, (batch,), generator=g),
        }
        for _ in range(count)
    ]


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the TensorBoard event files in ``run``: ``{tag: [(step, value), ...]}``."""

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
