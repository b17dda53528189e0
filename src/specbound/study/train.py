"""Training one run on the CPU and measuring it: train/test loss and accuracy, the training margin
distribution, and the margin handed to the gap bounds.

Optimiser: AdamW at a constant learning rate, batch size ``config.batch_size``; weight decay on
the weight matrices (embeddings and classifier included), none on biases and normalisation
parameters.  ``torch.manual_seed(seed)`` fixes the initialisation and a separate generator seeded
with ``seed`` the batch order, so a run is reproducible on one thread.

**The margin.**  For an example ``(x, y)`` the logit margin is ``f_y(x) - max_{j != y} f_j(x)``.
Following Jiang et al. (ICLR 2020, section 6: "the 10th percentile of the margin distribution"),
``gamma_logit`` is the 10th percentile of the *positive* training margins (runs stopped early still
misclassify some training examples, whose margins are negative; among the correctly classified
ones the percentile is always positive).  The bounds measure the network up to its last block's
output rows, so the margin passed to ``analyze(margin=...)`` is ``gamma_logit / head_lipschitz``
(:func:`.models.head_lipschitz`): the same margin in the units the bounds assume.  The training ramp
loss at that margin (1 for a margin <= 0, ``1 - m / gamma`` below ``gamma``, 0 above) is recorded:
the bounds say ``test error <= train ramp loss + gap bound``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .data import TaskData
from .models import build_model, forward_logits, head_lipschitz

MARGIN_QUANTILE = 0.1
EVAL_BATCH = 1000


def to_tensor(task: TaskData, x: np.ndarray) -> torch.Tensor:
    """Model inputs: normalised ``(n, 1, 28, 28)`` float images, or the token ids as they are."""
    if task.name == "fmnist":
        images = torch.tensor(x, dtype=torch.float32).div_(255.0).unsqueeze(1)
        return images.sub_(task.meta["mean"]).div_(task.meta["std"])
    return torch.tensor(x)


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: TaskData, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Mean cross-entropy, accuracy and every example's logit margin."""
    model.eval()
    losses, margins = [], []
    for i in range(0, len(y), EVAL_BATCH):
        logits = forward_logits(model, task.name, x[i:i + EVAL_BATCH]).double()
        target = y[i:i + EVAL_BATCH]
        losses.append(F.cross_entropy(logits, target, reduction="none"))
        true = logits.gather(1, target[:, None]).squeeze(1)
        others = logits.scatter(1, target[:, None], -math.inf).max(dim=1).values
        margins.append(true - others)
    loss, margin = torch.cat(losses).numpy(), torch.cat(margins).numpy()
    return {"loss": float(loss.mean()), "accuracy": float((margin > 0).mean()), "margins": margin}


def margin_summary(margins: np.ndarray, lipschitz: float) -> dict:
    """``gamma_logit`` (10th percentile of the positive margins), the normalised margin for the gap
    bounds, and the training ramp loss at it."""
    positive = margins[margins > 0]
    gamma_logit = float(np.quantile(positive, MARGIN_QUANTILE)) if positive.size else float("nan")
    ramp = np.clip(1.0 - margins / gamma_logit, 0.0, 1.0) if positive.size else np.ones_like(margins)
    return {
        "margin_definition": f"{MARGIN_QUANTILE:g} quantile of the positive training logit margins, "
                             "divided by head_lipschitz",
        "margin_logit": gamma_logit, "head_lipschitz": lipschitz, "margin": gamma_logit / lipschitz,
        "train_ramp_loss": float(ramp.mean()),
        "margin_quantiles": {f"q{int(q * 100):02d}": float(np.quantile(margins, q))
                             for q in (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9)},
    }


def train_run(config, task: TaskData, out_dir: Path) -> dict:
    """Train ``config`` (a :class:`.grid.RunConfig`) on ``task``; write ``init/`` and ``model/``
    (Hugging Face checkpoints) and ``train_margins.npy`` into ``out_dir``; return the metrics."""
    torch.manual_seed(config.seed)
    model = build_model(task.name, depth=config.depth, width=config.width, heads=config.heads,
                        ff_mult=config.ff_mult, num_labels=task.num_labels, meta=task.meta)
    model.save_pretrained(str(out_dir / "init"))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    x_np, y_np = task.train_subset(config.train_size)
    x_train, y_train = to_tensor(task, x_np), torch.from_numpy(y_np)
    generator = torch.Generator().manual_seed(config.seed)
    n, steps = len(y_train), 0
    start = time.perf_counter()
    model.train()
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=generator)
        for i in range(0, n, config.batch_size):
            batch = order[i:i + config.batch_size]
            loss = F.cross_entropy(forward_logits(model, task.name, x_train[batch]), y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
    train_seconds = time.perf_counter() - start
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"training diverged (loss {loss.item()}) for {config}")
    start = time.perf_counter()
    train = evaluate(model, task, x_train, y_train)
    test = evaluate(model, task, to_tensor(task, task.x_test), torch.from_numpy(task.y_test))
    eval_seconds = time.perf_counter() - start
    model.save_pretrained(str(out_dir / "model"))
    np.save(out_dir / "train_margins.npy", train["margins"].astype(np.float32))
    metrics = {
        "train_loss": train["loss"], "test_loss": test["loss"],
        "train_error": 1.0 - train["accuracy"], "test_error": 1.0 - test["accuracy"],
        "train_accuracy": train["accuracy"], "test_accuracy": test["accuracy"],
        "loss_gap": test["loss"] - train["loss"], "error_gap": train["accuracy"] - test["accuracy"],
        "n_train": int(n), "n_test": int(len(task.y_test)), "steps": steps,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "train_seconds": train_seconds, "eval_seconds": eval_seconds, "torch_threads": torch.get_num_threads(),
    }
    metrics.update(margin_summary(train["margins"], head_lipschitz(model)))
    return metrics
