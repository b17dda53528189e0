"""What the study trains: one :class:`RunConfig` per run, and the grids.

Seven hyper-parameters, ``HPARAMS``, each with three values (``AXES``): depth (up to 6), width,
training-set size, learning rate, batch size, AdamW weight decay and dropout; every run trains to
the criterion of :mod:`.train` (step cap ``max_steps``), and the seed redraws the initialisation,
the batch order *and the training sample*.

The full factorial (3^7 = 2,187 configurations per task and seed) is far beyond a CPU study.
The design is **one-at-a-time around base points**, the "coupled networks" design of Dziugaite et
al. (2020) and the granulated design of Jiang et al. (2020) restricted to single changes: for each
task, each *base point* is trained, and so is every configuration that changes exactly one
hyper-parameter of it to another value on its axis.  A base point therefore contributes
``1 + 7 x 2 = 15`` configurations, every axis gets groups of 3 runs that differ only in it
(Jiang's granulated tau), and pairs that differ in one value are Dziugaite's environments.

* ``default``: the two base points ``DEFAULT_BASES`` (a shallow-narrow-large-sample one and a
  deep-wide-small-sample one, so the single changes are seen from two places), 3 seeds, the three
  tasks: 2 x 15 x 3 x 3 = 270 runs, less the configurations the two bases share.
* ``quick``: one small base point ``QUICK_BASE``, one other value per axis (``QUICK_AXES``: two
  values each, small sizes), seed 0, plus the base and its depth and width changes again at seed 1
  (``QUICK_SCALING_SEEDS``), so that the growth exponents in depth and width have two clusters to
  resample: (8 + 3) x 3 = 33 runs.  For the tests and a first look; it cannot tell anything (one or
  two seeds, tiny sets).
* ``deep``: the default grid with the depth axis extended to 12 (``DEEP_DEPTHS``, the BERT
  Miniatures' depths), around both bases, 3 seeds: 270 + 3 x 2 x 3 x 3 = 324 runs.  It contains
  every default-grid run (same keys), so a default study folder is extended, not redone; the extra
  runs are the deepest and slowest of all and are meant for Dask workers (``--workers`` /
  ``--scheduler``; docs/study-results.md for the estimate).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from ..errors import SpecboundError
from ..options import NON_NEGATIVE_INT, POSITIVE_INT, Choice, check
from .data import TASKS

# Bumped whenever training or measuring changes what a run's record means: old records are then
# simply not found (their key differs) instead of being mixed with new ones.
STUDY_VERSION = 3  # 3: learning-rate warm-up
HPARAMS = ("depth", "width", "train_size", "lr", "batch_size", "weight_decay", "dropout")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one run.  ``key`` hashes all of it (and ``STUDY_VERSION``)."""

    task: str
    depth: int
    width: int
    train_size: int
    lr: float
    batch_size: int
    weight_decay: float
    dropout: float
    seed: int
    heads: int = 4
    ff_mult: int = 2
    max_steps: int = 3000

    def __post_init__(self):
        check("task", self.task, Choice(TASKS))
        for name in ("depth", "width", "train_size", "heads", "ff_mult", "batch_size", "max_steps"):
            check(name, getattr(self, name), POSITIVE_INT)
        check("seed", self.seed, NON_NEGATIVE_INT)
        if self.width % self.heads:
            raise SpecboundError(f"width {self.width} is not a multiple of heads {self.heads}")
        if not self.weight_decay >= 0 or not self.lr > 0:
            raise SpecboundError(f"weight_decay must be >= 0 and lr > 0, got {self.weight_decay}, {self.lr}")
        if not 0 <= self.dropout < 1:
            raise SpecboundError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def key(self) -> str:
        """12 hex digits of SHA-256 over the canonical JSON of the config and ``STUDY_VERSION``."""
        doc = json.dumps({"study_version": STUDY_VERSION, **self.to_dict()}, sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        """The run's folder name: the task and the key."""
        return f"{self.task}-{self.key}"

    @property
    def cost(self) -> float:
        """Relative cost (depth x width x examples, times a rough steps-to-criterion factor), for
        scheduling the longest runs first."""
        return self.depth * self.width * self.train_size * (1.0 + 3.0 * self.dropout) / self.lr**0.5


AXES = {
    "depth": (2, 4, 6),
    "width": (32, 64, 128),
    "train_size": (256, 512, 1024),
    "lr": (5e-4, 1e-3, 2e-3),
    "batch_size": (32, 64, 128),
    "weight_decay": (0.0, 0.1, 0.5),
    "dropout": (0.0, 0.1, 0.2),
}
# Base B's learning rate is 1e-3 and the axis stops at 2e-3: post-LayerNorm BERT at depth 4-6 on
# fortunes collapses to chance at 2e-3 (train error 0.80 after 3,000 steps, seeds 0-2) and trains
# to the criterion at 1e-3 (720 steps at depth 4, 1,000 at depth 6; docs/study.md section 10).
DEFAULT_BASES = (
    {"depth": 2, "width": 32, "train_size": 512, "lr": 2e-3, "batch_size": 64, "weight_decay": 0.0, "dropout": 0.0},
    {"depth": 4, "width": 64, "train_size": 256, "lr": 1e-3, "batch_size": 32, "weight_decay": 0.1, "dropout": 0.1},
)
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_MAX_STEPS = 3000

QUICK_AXES = {
    "depth": (1, 2),
    "width": (16, 24),
    "train_size": (128, 192),
    "lr": (2e-3, 3e-3),
    "batch_size": (32, 64),
    "weight_decay": (0.0, 0.1),
    "dropout": (0.0, 0.05),
}
QUICK_BASE = {
    "depth": 1,
    "width": 16,
    "train_size": 128,
    "lr": 3e-3,
    "batch_size": 32,
    "weight_decay": 0.0,
    "dropout": 0.0,
}
QUICK_SEEDS = (0,)
QUICK_SCALING_SEEDS = (1,)  # the base and its depth and width changes once more: a second cluster
QUICK_MAX_STEPS = 1000
DEEP_DEPTHS = (2, 4, 6, 8, 10, 12)


def one_at_a_time(
    task: str, bases: tuple[dict, ...], axes: dict[str, tuple], seeds: tuple[int, ...], **fixed
) -> list[RunConfig]:
    """Each base point and every configuration that changes one hyper-parameter of it to another
    value of its axis, for each seed; a configuration reached from two bases is listed once."""
    configs, seen = [], set()
    for base in bases:
        points = [dict(base)] + [{**base, h: v} for h in axes for v in axes[h] if v != base[h]]
        for point in points:
            for seed in seeds:
                c = RunConfig(task=task, seed=seed, **fixed, **point)
                if c.key not in seen:
                    seen.add(c.key)
                    configs.append(c)
    return configs


def default_grid(tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    return [
        c
        for task in tasks
        for c in one_at_a_time(task, DEFAULT_BASES, AXES, DEFAULT_SEEDS, max_steps=DEFAULT_MAX_STEPS)
    ]


def quick_grid(tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    scaling_axes = {h: QUICK_AXES[h] for h in ("depth", "width")}
    return [
        c
        for task in tasks
        for c in (
            one_at_a_time(task, (QUICK_BASE,), QUICK_AXES, QUICK_SEEDS, max_steps=QUICK_MAX_STEPS)
            + one_at_a_time(task, (QUICK_BASE,), scaling_axes, QUICK_SCALING_SEEDS, max_steps=QUICK_MAX_STEPS)
        )
    ]


def deep_grid(tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    axes = {**AXES, "depth": DEEP_DEPTHS}
    return [
        c
        for task in tasks
        for c in one_at_a_time(task, DEFAULT_BASES, axes, DEFAULT_SEEDS, max_steps=DEFAULT_MAX_STEPS)
    ]


GRIDS = {"default": default_grid, "quick": quick_grid, "deep": deep_grid}


def make_grid(name: str, tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    if name not in GRIDS:
        raise SpecboundError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}")
    unknown = set(tasks) - set(TASKS)
    if unknown or not tasks:
        raise SpecboundError(f"tasks must be among {', '.join(TASKS)}, got {', '.join(tasks) or 'none'}")
    return GRIDS[name](tuple(tasks))


def with_seeds(configs: list[RunConfig], seeds: tuple[int, ...]) -> list[RunConfig]:
    """The same configurations over other seeds (a bigger grid: ``--seeds``)."""
    out, seen = [], set()
    for c in configs:
        for s in seeds:
            r = replace(c, seed=s)
            if r.key not in seen:
                seen.add(r.key)
                out.append(r)
    return out
