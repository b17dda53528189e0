"""SpecboundCallback in a real Lightning Trainer: the bounds reach the Trainer's TensorBoard logger
(read back from its event files) at the steps asked for, and the store holds the same numbers as an
analysis of the weights the training ends with."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorboard")
lightning = pytest.importorskip("lightning")

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.sweep.store import Store  # noqa: E402

from .conftest import EVERY, STEPS, scalars, tiny_classifier, token_batches  # noqa: E402


class _Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = tiny_classifier()

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        import torch

        return torch.optim.SGD(self.parameters(), lr=0.5)


def _trainer(tmp_path, callback):
    from lightning.pytorch.loggers import TensorBoardLogger

    return lightning.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=TensorBoardLogger(str(tmp_path / "tb"), name="run"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_lightning_logs_the_bounds_to_its_loggers_and_the_store(tmp_path):
    from specbound.integrations.lightning import SpecboundCallback

    callback = SpecboundCallback(every_n_steps=EVERY, store=tmp_path / "store", grid_m=4, quiet=True)
    module = _Module()
    trainer = _trainer(tmp_path, callback)
    import torch

    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(token_batches(STEPS), batch_size=None))
    steps = [0, 3, 6]
    assert [h["step"] for h in callback.monitor.history] == steps

    logged = scalars(trainer.logger.log_dir)
    assert "train_loss" in logged
    assert [s for s, _ in logged["specbound/spectral_adaptive"]] == steps
    for (_, value), entry in zip(logged["specbound/edelman"], callback.monitor.history):
        assert value == pytest.approx(entry["bounds"]["edelman"], rel=1e-6)

    records = sorted(Store(tmp_path / "store").records(tables=()), key=lambda r: r.meta["labels"]["step"])
    assert [r.meta["labels"]["step"] for r in records] == steps
    # the module's own logged numbers (self.log("train_loss")) are in the records after step 0
    logged_losses = [v for _, v in logged["train_loss"]]
    assert records[0].meta["metrics"] == {}
    for record in records[1:]:
        assert set(record.meta["metrics"]) == {"train_loss"}
        assert min(abs(record.meta["metrics"]["train_loss"] - v) for v in logged_losses) < 1e-6
    module.model.save_pretrained(tmp_path / "final")
    final = specbound.analyze(tmp_path / "final", grid_m=4, threads=1)
    assert records[-1].bounds == pytest.approx(final.all_bounds(), rel=1e-12)


def test_a_module_without_a_transformer_is_one_line(tmp_path):
    import torch

    from specbound.integrations.lightning import SpecboundCallback

    class Plain(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 2)

    with pytest.raises(SpecboundError, match="pass model_attr='NAME'"):
        SpecboundCallback(every_n_steps=1, quiet=True)._transformer(Plain())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(bounds=5), "bounds must be"),
        (dict(bounds=None), "bounds must be"),
        (dict(store=5), "store must be"),
        (dict(store=["s"]), "store must be"),
        (dict(model_attr=3), "model_attr must name"),
        (dict(model_attr=""), "model_attr must name"),
        (dict(run_name=None), "run_name must be"),
    ],
)
def test_bad_arguments_are_one_line_before_training(kwargs, message):
    from specbound.integrations.lightning import SpecboundCallback

    with pytest.raises(SpecboundError, match=message) as err:
        SpecboundCallback(**kwargs)
    assert "\n" not in str(err.value)
