"""``SpecboundCallback`` for PyTorch Lightning: the model analysed in memory every N optimizer steps,
the bounds logged through every logger of the ``Trainer`` (TensorBoard, W&B, CSV, ...), a record per
analysis in a results store.

    >>> from specbound.integrations.lightning import SpecboundCallback
    >>> trainer = lightning.Trainer(callbacks=[SpecboundCallback(every_n_steps=100, store="bounds/")])
    >>> trainer.fit(module)      # then: specbound report --store bounds/ --out report/

The callback subclasses ``lightning.pytorch.Callback`` (the ``lightning`` package), or
``pytorch_lightning.Callback`` where only that package is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecboundError
from .monitor import BoundMonitor

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

__all__ = ["SpecboundCallback"]


class SpecboundCallback(Callback):
    """Analyse the module's transformer every ``every_n_steps`` steps (and before the first).

    Parameters
    ----------
    every_n_steps, store, bounds, run_name, at_start, quiet, **options
        As :class:`specbound.integrations.monitor.BoundMonitor`.
    model_attr : str
        The attribute of the LightningModule holding the transformer (a module with a ``.config``,
        e.g. a transformers model), default ``"model"``; the LightningModule itself when it has a
        ``.config``.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        *,
        store: str | Path | None = None,
        bounds="headline",
        run_name: str = "train",
        at_start: bool = True,
        quiet: bool = False,
        model_attr: str = "model",
        **options: Any,
    ):
        super().__init__()
        self.monitor = BoundMonitor(
            every_n_steps, store=store, bounds=bounds, run_name=run_name, at_start=at_start, quiet=quiet, **options
        )
        if not isinstance(model_attr, str) or not model_attr:
            raise SpecboundError(
                f"model_attr must name the LightningModule's attribute holding the model (a "
                f"non-empty string), found {model_attr!r}"
            )
        self.model_attr = model_attr

    def on_train_start(self, trainer, pl_module) -> None:
        self.monitor.start()
        if trainer.is_global_zero and self.monitor.due(trainer.global_step, start=True):
            self._analyse(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero and self.monitor.due(trainer.global_step):
            self._analyse(trainer, pl_module)

    def _analyse(self, trainer, pl_module) -> None:
        # the numbers the module logged (self.log: the training loss, validation metrics), latest values
        scalars = self.monitor.measure(
            self._transformer(pl_module), trainer.global_step, metrics=dict(trainer.callback_metrics)
        )
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=trainer.global_step)
            logger.save()

    def _transformer(self, pl_module):
        if getattr(pl_module, "config", None) is not None:
            return pl_module
        inner = getattr(pl_module, self.model_attr, None)
        if inner is None or getattr(inner, "config", None) is None:
            raise SpecboundError(
                f"SpecboundCallback analyses a transformer with a .config: {type(pl_module).__name__} has none "
                f"and its attribute {self.model_attr!r} is {type(inner).__name__}; pass model_attr='NAME' "
                f"naming the attribute that holds it"
            )
        return inner
