"""Stage 8 (beside ``report``), integrations: specbound inside a training loop, callbacks that analyse the model
in memory every N steps.

* :class:`specbound.integrations.transformers.SpecboundCallback`: a ``transformers.TrainerCallback``
  (bounds logged to the TensorBoard run in ``logging_dir`` and to W&B when active).
* :class:`specbound.integrations.lightning.SpecboundCallback`: a PyTorch Lightning ``Callback``
  (bounds logged through every logger of the ``Trainer``).

Both append one record per analysis to a results store (``store=``), read by ``specbound report
--store``.  Each module imports its framework; this package imports nothing heavy.
"""
