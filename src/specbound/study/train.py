"""Training one run to a criterion on the CPU and measuring it: train/test loss and error, the
training margin distribution, the normalised margin handed to the gap bounds, and the
data-dependent reference predictors (PAC-Bayes flatness, inverse margin).

**Training to a criterion.**  AdamW at learning rate ``config.lr`` after a linear warm-up over the
first ``WARMUP_STEPS`` steps (constant after it), batch size
``config.batch_size``; weight decay on the weight matrices, none on biases and normalisation
parameters.  After every epoch whose running (training-mode) accuracy reaches ``CHECK_ACCURACY``,
the whole training set is evaluated (eval mode, no dropout); training stops as soon as the
cross-entropy is ``<= CRITERION_LOSS`` or the error ``<= CRITERION_ERROR`` (Jiang et al. 2020 stop
at cross-entropy 0.01; the error form lets dropout runs, whose loss plateaus higher, meet it), or
at ``config.max_steps``.  ``converged`` records which: a run that missed it is kept on disk and
listed in the report, but left out of every correlation (its gap would measure under-training).

``torch.manual_seed(seed)`` fixes the initialisation, a generator seeded with ``seed`` the batch
order, and the seed also draws the training sample (:meth:`.data.TaskData.train_subset`).

**The margin.**  For an example ``(x, y)`` the logit margin is ``f_y(x) - max_{j != y} f_j(x)``;
``gamma_logit`` is its 10th percentile over the training set (Jiang et al., section 6; trained to
the criterion, at least 99% of the margins are positive, so it is positive).  The bounds measure
the network up to the last block's output rows *as if those rows had norm at most 1*; the head
reads a row ``h`` with ``|f_y - f_j| <= head_lipschitz * ||h||``.  So the margin in the bounds'
units is ``gamma_logit / (head_lipschitz * R)`` with ``R`` the **largest observed norm of the rows the
head reads over the training set** (``row_norm_max``; they come out of LayerNorm with norm about
``sqrt(width) |g|``, not 1).  The training ramp loss at ``gamma_logit`` is recorded.

**Reference predictors** (the data-dependent measures that did best in Jiang et al. 2020 and
Dziugaite et al. 2020):

* ``sigma_flat``: the largest ``sigma`` such that perturbing every parameter by ``sigma * z``,
  ``z ~ N(0, I)``, raises the training error by at most ``FLAT_TARGET`` (0.1, as Jiang et al.) on
  average over ``FLAT_DRAWS`` draws, found by bisection on ``log sigma`` over a fixed training
  subsample and fixed draws (common random numbers: the error is then a deterministic function of
  sigma, and bisection finds its crossing);
* ``pacbayes_flatness = 1 / sigma_flat^2`` and ``pacbayes_init = ||w - w0||^2 / (4 sigma_flat^2)
  + log(m / sigma_flat) + 10`` (Jiang et al.'s ``pacbayes.flatness`` and ``pacbayes.init``);
* ``inverse_margin = 1 / gamma_logit^2`` (Jiang et al.'s ``inverse.margin``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch  # noqa: TID253 -- the study's training: imported by study.runs' worker only, with torch installed
import torch.nn.functional as F  # noqa: TID253

from .data import TaskData
from .models import build_model, forward_logits, forward_with_rows, head_lipschitz  # noqa: TID253

MARGIN_QUANTILE = 0.1
EVAL_BATCH = 1000
CRITERION_LOSS = 0.01
CRITERION_ERROR = 0.01
CHECK_ACCURACY = 0.8  # running (training-mode, dropout on) accuracy that makes a full evaluation worthwhile
WARMUP_STEPS = 100  # linear learning-rate warm-up: post-LayerNorm BERT at depth 6 does not train without it
FLAT_TARGET = 0.1
FLAT_DRAWS = 3
FLAT_EXAMPLES = 512
FLAT_STEPS = 10
FLAT_BRACKET = (1e-4, 1.0)


def to_tensor(task: TaskData, x: np.ndarray) -> torch.Tensor:
    """Model inputs: normalised ``(n, 1, 28, 28)`` float images, or the token ids as they are."""
    if task.name == "fmnist":
        images = torch.tensor(x, dtype=torch.float32).div_(255.0).unsqueeze(1)
        return images.sub_(task.meta["mean"]).div_(task.meta["std"])
    return torch.tensor(x)


def logit_margins(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``f_y - max_{j != y} f_j`` per row: ``(B, C), (B,) -> (B,)``."""
    true = logits.gather(1, target[:, None]).squeeze(1)
    others = logits.scatter(1, target[:, None], -math.inf).max(dim=1).values
    return true - others


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: TaskData, x: torch.Tensor, y: torch.Tensor, *, rows: bool = False) -> dict:
    """Mean cross-entropy, accuracy, error (mistakes / n), every example's logit margin and
    (``rows``) the norm of the row the head reads."""
    model.eval()
    losses, margins, norms = [], [], []
    for i in range(0, len(y), EVAL_BATCH):
        if rows:
            logits, h = forward_with_rows(model, task.name, x[i : i + EVAL_BATCH])
            norms.append(torch.linalg.vector_norm(h.double(), dim=1))
        else:
            logits = forward_logits(model, task.name, x[i : i + EVAL_BATCH])
        logits, target = logits.double(), y[i : i + EVAL_BATCH]
        losses.append(F.cross_entropy(logits, target, reduction="none"))
        margins.append(logit_margins(logits, target))
    loss, margin = torch.cat(losses).numpy(), torch.cat(margins).numpy()
    # The error is mistakes / n in one correctly rounded division (a NaN margin is a mistake), so
    # that k mistakes in 100k examples meet the 0.01 criterion exactly; 1 - accuracy would be
    # 0.010000000000000009 there, just over it.
    mistakes = int(np.count_nonzero(~(margin > 0)))
    doc = {
        "loss": float(loss.mean()),
        "accuracy": float((margin > 0).mean()),
        "error": mistakes / len(margin),
        "margins": margin,
    }
    if rows:
        doc["row_norms"] = torch.cat(norms).numpy()
    return doc


def meets_criterion(evaluation: dict) -> bool:
    """The training criterion on a whole-training-set :func:`evaluate`: cross-entropy
    ``<= CRITERION_LOSS`` or error ``<= CRITERION_ERROR`` (both inclusive)."""
    return evaluation["loss"] <= CRITERION_LOSS or evaluation["error"] <= CRITERION_ERROR


def margin_summary(margins: np.ndarray, lipschitz: float, row_norm_max: float) -> dict:
    """``gamma_logit`` (10th percentile of the training margins), the normalised margin for the gap
    bounds ``gamma_logit / (lipschitz * row_norm_max)``, and the training ramp loss at ``gamma_logit``.
    A non-positive percentile (a run far from the criterion) gives margin NaN: no gap bound."""
    gamma_logit = float(np.quantile(margins, MARGIN_QUANTILE))
    ok = gamma_logit > 0
    ramp = np.clip(1.0 - margins / gamma_logit, 0.0, 1.0) if ok else np.ones_like(margins)
    return {
        "margin_definition": f"{MARGIN_QUANTILE:g} quantile of the training logit margins, divided by "
        "head_lipschitz * row_norm_max",
        "margin_logit": gamma_logit,
        "head_lipschitz": lipschitz,
        "row_norm_max": row_norm_max,
        "margin": gamma_logit / (lipschitz * row_norm_max) if ok else math.nan,
        "train_ramp_loss": float(ramp.mean()),
        "inverse_margin": 1.0 / gamma_logit**2 if ok else math.nan,
        "margin_quantiles": {
            f"q{int(q * 100):02d}": float(np.quantile(margins, q)) for q in (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9)
        },
    }


@torch.no_grad()
def flatness_sigma(
    model: torch.nn.Module,
    task: TaskData,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    target: float = FLAT_TARGET,
    draws: int = FLAT_DRAWS,
    steps: int = FLAT_STEPS,
    bracket: tuple[float, float] = FLAT_BRACKET,
) -> dict:
    """The largest ``sigma`` (to within the bisection's resolution) with mean training error under
    ``w + sigma z`` at most the unperturbed error plus ``target``; ``z`` fixed per draw.

    Returns ``sigma`` (the bracket's lower end if even it overshoots, the upper end if even it does
    not), the base and the perturbed error at ``sigma``, and ``sigma_censored`` (-1 / +1 when
    ``sigma`` hit the bracket's lower / upper end, else 0)."""
    model.eval()
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(10_000 + seed)
    noise = [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params] for _ in range(draws)]

    def error(sigma: float) -> float:
        errs = []
        for z in noise:
            for p, w, dz in zip(params, saved, z):
                p.copy_(w + sigma * dz)
            logits = torch.cat(
                [forward_logits(model, task.name, x[i : i + EVAL_BATCH]) for i in range(0, len(y), EVAL_BATCH)]
            )
            errs.append(float((logits.argmax(1) != y).double().mean()))
        return float(np.mean(errs))

    try:
        base = float(
            (
                torch.cat(
                    [forward_logits(model, task.name, x[i : i + EVAL_BATCH]) for i in range(0, len(y), EVAL_BATCH)]
                ).argmax(1)
                != y
            )
            .double()
            .mean()
        )
        lo, hi = math.log(bracket[0]), math.log(bracket[1])
        censored = 0
        if error(math.exp(hi)) <= base + target:
            lo, censored = hi, 1
        elif error(math.exp(lo)) > base + target:
            hi, censored = lo, -1
        else:
            for _ in range(steps):  # invariant: error(e^lo) <= base + target < error(e^hi)
                mid = 0.5 * (lo + hi)
                if error(math.exp(mid)) <= base + target:
                    lo = mid
                else:
                    hi = mid
        sigma = math.exp(lo)
        return {
            "sigma_flat": sigma,
            "sigma_censored": censored,
            "flat_base_error": base,
            "flat_error_at_sigma": error(sigma),
        }
    finally:
        for p, w in zip(params, saved):
            p.copy_(w)


def train_run(config, task: TaskData, out_dir: Path) -> dict:
    """Train ``config`` (a :class:`.grid.RunConfig`) on ``task`` to the criterion; write ``init/``
    and ``model/`` (Hugging Face checkpoints) and ``train_margins.npy`` into ``out_dir``; return the
    metrics."""
    cpu_start = time.process_time()
    torch.manual_seed(config.seed)
    model = build_model(
        task.name,
        depth=config.depth,
        width=config.width,
        heads=config.heads,
        ff_mult=config.ff_mult,
        num_labels=task.num_labels,
        meta=task.meta,
        dropout=config.dropout,
    )
    model.save_pretrained(str(out_dir / "init"))
    init = [p.detach().clone() for p in model.parameters()]
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    x_np, y_np = task.train_subset(config.train_size, config.seed)
    x_train, y_train = to_tensor(task, x_np), torch.from_numpy(y_np)
    generator = torch.Generator().manual_seed(config.seed)
    n, steps, epochs, checks, converged = len(y_train), 0, 0, 0, False
    train = None
    start = time.perf_counter()
    while steps < config.max_steps and not converged:
        model.train()
        order = torch.randperm(n, generator=generator)
        correct = 0
        for i in range(0, n, config.batch_size):
            batch = order[i : i + config.batch_size]
            logits = forward_logits(model, task.name, x_train[batch])
            loss = F.cross_entropy(logits, y_train[batch])
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"training diverged (loss {loss.item()}) at step {steps} for {config}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            warmup.step()
            correct += int((logits.argmax(1) == y_train[batch]).sum())
            steps += 1
            if steps >= config.max_steps:
                break
        epochs += 1
        if correct / n >= CHECK_ACCURACY or steps >= config.max_steps:
            checks += 1
            train = evaluate(model, task, x_train, y_train)
            converged = meets_criterion(train)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    train = evaluate(model, task, x_train, y_train, rows=True)
    test = evaluate(model, task, to_tensor(task, task.x_test), torch.from_numpy(task.y_test))
    eval_seconds = time.perf_counter() - start
    start = time.perf_counter()
    sub = torch.from_numpy(np.random.default_rng([config.seed, 2]).permutation(n)[:FLAT_EXAMPLES])
    flat = flatness_sigma(model, task, x_train[sub], y_train[sub], seed=config.seed)
    flat_seconds = time.perf_counter() - start
    with torch.no_grad():
        dist2 = float(sum(torch.sum((p.detach().double() - w.double()) ** 2) for p, w in zip(model.parameters(), init)))
    model.save_pretrained(str(out_dir / "model"))
    np.save(out_dir / "train_margins.npy", train["margins"].astype(np.float32))
    sigma = flat["sigma_flat"]
    metrics = {
        "converged": bool(converged),
        "criterion": f"train cross-entropy <= {CRITERION_LOSS:g} or train error <= "
        f"{CRITERION_ERROR:g} within {config.max_steps} steps",
        "train_loss": train["loss"],
        "test_loss": test["loss"],
        "train_error": train["error"],
        "test_error": test["error"],
        "train_accuracy": train["accuracy"],
        "test_accuracy": test["accuracy"],
        "loss_gap": test["loss"] - train["loss"],
        "error_gap": test["error"] - train["error"],
        "n_train": int(n),
        "n_test": int(len(task.y_test)),
        "steps": steps,
        "epochs": epochs,
        "checks": checks,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "row_norm_median": float(np.median(train["row_norms"])),
        **flat,
        "pacbayes_flatness": 1.0 / sigma**2,
        "pacbayes_init": dist2 / (4 * sigma**2) + math.log(n / sigma) + 10.0,
        "distance_from_init": math.sqrt(dist2),
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "flat_seconds": flat_seconds,
        "torch_threads": torch.get_num_threads(),
    }
    metrics.update(margin_summary(train["margins"], head_lipschitz(model), float(train["row_norms"].max())))
    metrics["cpu_seconds"] = time.process_time() - cpu_start
    return metrics
