"""``SpecboundCallback`` for the transformers ``Trainer``: the model analysed in memory every N
optimizer steps, the bounds logged beside the loss (TensorBoard, W&B, ``trainer_state.json``), a
record per analysis in a results store.

    >>> from specbound.integrations.transformers import SpecboundCallback
    >>> trainer = Trainer(model, args, train_dataset=data,
    ...                   callbacks=[SpecboundCallback(every_n_steps=100, store="bounds/")])
    >>> trainer.train()          # then: specbound report --store bounds/ --out report/
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback  # noqa: TID253 -- the transformers callback, imported by its user

from .monitor import BoundMonitor, check_path_argument

__all__ = ["SpecboundCallback"]


class SpecboundCallback(TrainerCallback):
    """Analyse the Trainer's model every ``every_n_steps`` steps (and before the first).

    The scalars are ``specbound/<bound>`` and ``specbound/log10_<bound>`` at the global step; with
    W&B active (``report_to`` includes ``wandb``) they are logged there too, and every analysis is
    appended to ``state.log_history`` (so ``trainer_state.json`` keeps them).  Only the main process
    analyses.

    Parameters
    ----------
    every_n_steps, store, bounds, at_start, quiet, **options
        As :class:`specbound.integrations.monitor.BoundMonitor` (``options``: any
        :class:`~specbound.options.AnalysisOptions` field, e.g. ``n=``, ``margin=``, ``grid_m=``).
    run_name : str, optional
        The records' ``run`` label (default: the TrainingArguments' ``run_name``, else ``train``).
    log_dir : path, optional
        Where the TensorBoard scalars go.  Default: the Trainer's TensorBoard run
        (``TENSORBOARD_LOGGING_DIR``; ``logging_dir`` in transformers 4; else the run folder its
        TensorBoard callback made under ``output_dir/runs`` for this training), when ``report_to``
        includes ``tensorboard``.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        *,
        store: str | Path | None = None,
        bounds="headline",
        run_name: str | None = None,
        at_start: bool = True,
        quiet: bool = False,
        log_dir: str | Path | None = None,
        **options: Any,
    ):
        check_path_argument(log_dir, "log_dir", "the TensorBoard folder")
        self.monitor = BoundMonitor(
            every_n_steps,
            store=store,
            bounds=bounds,
            run_name=run_name or "train",
            at_start=at_start,
            quiet=quiet,
            **options,
        )
        self._run_name_given = run_name is not None
        self._log_dir = None if log_dir is None else Path(log_dir)
        self._writer = None
        self._created = time.time()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.monitor.start()
        if not self._run_name_given and getattr(args, "run_name", None):
            self.monitor.run_name = str(args.run_name)
        if state.is_world_process_zero and self.monitor.due(state.global_step, start=True):
            self._analyse(args, state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero and self.monitor.due(state.global_step):
            self._analyse(args, state, model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The Trainer's training loss and evaluation metrics of an analysed step go into its record."""
        if state.is_world_process_zero and logs:
            self.monitor.add_metrics(state.global_step, trainer_metrics(logs))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.monitor.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _analyse(self, args, state, model) -> None:
        step = state.global_step
        # the record waits for this step's on_log (the Trainer logs the loss and evaluates after on_step_end)
        scalars = self.monitor.measure(model, step, hold=True)
        state.log_history.append({**scalars, "step": step})
        reports = set(getattr(args, "report_to", None) or ())
        if "tensorboard" in reports or self._log_dir is not None:
            writer = self._tensorboard(args)
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)
            writer.flush()
        if "wandb" in reports:
            wandb = sys.modules.get("wandb")  # imported by the Trainer's own W&B callback when it is active
            if wandb is not None and getattr(wandb, "run", None) is not None:
                wandb.log({**scalars, "train/global_step": step})

    def _tensorboard(self, args):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self._log_dir or trainer_tensorboard_dir(args, self._created)))
        return self._writer


# Numbers of the Trainer's evaluation logs that say how fast it ran, not how well the model does.
_EVAL_TIMING = ("_runtime", "_samples_per_second", "_steps_per_second")


def trainer_metrics(logs: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one Trainer log that describe the model at its step: the training loss
    (``loss``, recorded as ``train_loss``) and every evaluation metric (``eval_*``, timings left out).
    The end-of-training summary's ``train_loss`` (the mean over the run) is not one of them."""
    found = {"train_loss": logs["loss"]} if "loss" in logs else {}
    found.update({k: v for k, v in logs.items() if k.startswith("eval_") and not k.endswith(_EVAL_TIMING)})
    return found


def trainer_tensorboard_dir(args, since: float) -> Path:
    """The folder of the Trainer's TensorBoard run: ``TENSORBOARD_LOGGING_DIR``, ``args.logging_dir``
    (transformers 4), else the newest ``output_dir/runs/<time>_<host>`` made since ``since`` (its
    TensorBoard callback makes it when training begins, before this callback's turn), else
    ``output_dir/runs/specbound`` (a run of its own beside the Trainer's)."""
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if env:
        return Path(env).expanduser()
    if getattr(args, "logging_dir", None):
        return Path(args.logging_dir)
    runs = Path(args.output_dir) / "runs"
    host = socket.gethostname()
    made = [p for p in runs.glob(f"*_{host}") if p.is_dir() and p.stat().st_mtime >= since - 1]
    return max(made, key=lambda p: p.stat().st_mtime) if made else runs / "specbound"
