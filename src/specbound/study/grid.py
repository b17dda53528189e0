"""What the study trains: one :class:`RunConfig` per run, and the two grids.

The grid varies the five hyper-parameters of issue #5, ``HPARAMS``: depth, width, training-set
size, weight decay and training length (epochs), over several seeds, for each task.

* ``default``: for each task the full factorial ``2^5`` over ``DEFAULT_AXES``, 3 seeds: 96 runs per
  task, 192 in all.  The ``(train_size, epochs)`` corners are chosen so that the two "diagonal"
  twins take the same number of optimiser steps: (500 examples, 24 epochs) and (2000, 6) both take
  192 steps of batch 64, so their difference is data, not optimisation.
* ``quick``: for each task, at one small architecture, three corners of the ``(train_size, epochs)``
  square, (192, 10), (192, 40) and (768, 10) (the fourth, most expensive corner is left out), plus
  one run changing depth, one width, one weight decay at the (192, 40) corner: every
  hyper-parameter has one group for the granulated correlation.  One seed; 6 runs per task, 12 in
  all.  Its twins, (192, 40) and (768, 10), both take 120 steps.

Jiang et al.'s granulated correlation needs groups of runs that differ in exactly one
hyper-parameter; both designs have them (the factorial everywhere, the quick one around one corner).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, replace

from ..errors import SpecboundError
from .data import TASKS

# Bumped whenever training or measuring changes what a run's record means: old records are then
# simply not found (their key differs) instead of being mixed with new ones.
STUDY_VERSION = 1
HPARAMS = ("depth", "width", "train_size", "weight_decay", "epochs")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one run.  ``key`` hashes all of it (and ``STUDY_VERSION``)."""

    task: str
    depth: int
    width: int
    train_size: int
    weight_decay: float
    epochs: int
    seed: int
    heads: int = 4
    ff_mult: int = 2
    lr: float = 1e-3
    batch_size: int = 64

    def __post_init__(self):
        if self.task not in TASKS:
            raise SpecboundError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        for name in ("depth", "width", "train_size", "epochs", "heads", "ff_mult", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecboundError(f"{name} must be a positive integer, got {value!r}")
        if self.width % self.heads:
            raise SpecboundError(f"width {self.width} is not a multiple of heads {self.heads}")
        if not self.weight_decay >= 0 or not self.lr > 0:
            raise SpecboundError(f"weight_decay must be >= 0 and lr > 0, got {self.weight_decay}, {self.lr}")

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
        """Relative training cost (example passes times a model-size factor), for scheduling."""
        return self.train_size * self.epochs * self.depth * self.width


def factorial(task: str, axes: dict[str, tuple], seeds: tuple[int, ...], **fixed) -> list[RunConfig]:
    """Every combination of ``axes`` values, for each seed."""
    names = list(axes)
    return [RunConfig(task=task, seed=seed, **fixed, **dict(zip(names, values)))
            for values in itertools.product(*(axes[n] for n in names)) for seed in seeds]


DEFAULT_AXES = {"depth": (1, 2), "width": (32, 64), "train_size": (500, 2000), "weight_decay": (0.0, 1.0),
                "epochs": (6, 24)}
DEFAULT_SEEDS = (0, 1, 2)

QUICK_BASE = {"depth": 1, "width": 32, "weight_decay": 0.0}
QUICK_POINTS = ({"train_size": 192, "epochs": 10}, {"train_size": 192, "epochs": 40},
                {"train_size": 768, "epochs": 10})
QUICK_VARIATIONS = {"depth": 2, "width": 16, "weight_decay": 1.0}  # each applied alone at QUICK_CORNER
QUICK_CORNER = {"train_size": 192, "epochs": 40}
QUICK_SEEDS = (0,)


def default_grid(tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    return [c for task in tasks for c in factorial(task, DEFAULT_AXES, DEFAULT_SEEDS)]


def quick_grid(tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    runs = []
    for task in tasks:
        runs += [RunConfig(task=task, seed=seed, **QUICK_BASE, **point)
                 for point in QUICK_POINTS for seed in QUICK_SEEDS]
        corner = RunConfig(task=task, seed=QUICK_SEEDS[0], **QUICK_BASE, **QUICK_CORNER)
        runs += [replace(corner, **{name: value}) for name, value in QUICK_VARIATIONS.items()]
    return runs


GRIDS = {"default": default_grid, "quick": quick_grid}


def make_grid(name: str, tasks: tuple[str, ...] = TASKS) -> list[RunConfig]:
    if name not in GRIDS:
        raise SpecboundError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}")
    unknown = set(tasks) - set(TASKS)
    if unknown or not tasks:
        raise SpecboundError(f"tasks must be among {', '.join(TASKS)}, got {', '.join(tasks) or 'none'}")
    return GRIDS[name](tuple(tasks))
