"""SpecboundCallback in a real transformers Trainer: the model analysed in memory every N steps,
the bounds in the Trainer's TensorBoard run beside the loss (read back from the event files), one
record per analysis in a store that `specbound report` reads, the same numbers as an analysis of the
saved weights."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorboard")
transformers = pytest.importorskip("transformers")

import re
import sys

import specbound  # noqa: E402
import specbound.report.plots as plots
from specbound import SpecboundError  # noqa: E402
from specbound.cli import main
from specbound.integrations.monitor import BoundMonitor, share, state_digest
from specbound.report.trajectory import figure_trajectory
from specbound.sweep.store import Store  # noqa: E402

from .conftest import EVERY, STEPS, scalars, tiny_classifier, token_batches  # noqa: E402


def _train(tmp_path, callback, report_to=("tensorboard",)):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        logging_steps=2,
        report_to=list(report_to),
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=5e-2,
        run_name="tiny",
    )
    trainer = Trainer(
        model=tiny_classifier(),
        args=args,
        train_dataset=_Dataset(token_batches(4 * STEPS, batch=1)),
        callbacks=[callback],
    )
    trainer.train()
    return trainer


class _Dataset:  # a list of examples, as Trainer's default collator wants them
    def __init__(self, batches):
        self.items = [{"input_ids": b["input_ids"][0], "labels": b["labels"][0]} for b in batches]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_trainer_logs_the_bounds_to_tensorboard_and_the_store(tmp_path, quiet_transformers, capsys):
    from specbound.integrations.transformers import SpecboundCallback

    callback = SpecboundCallback(every_n_steps=EVERY, store=tmp_path / "store", grid_m=4)
    trainer = _train(tmp_path, callback)
    steps = [0, 3, 6]
    assert [h["step"] for h in callback.monitor.history] == steps

    runs = [p for p in (tmp_path / "out" / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1  # the bounds are in the Trainer's own TensorBoard run
    logged = scalars(runs[0])
    assert "train/loss" in logged
    for bound in ("spectral_adaptive", "edelman"):
        assert [s for s, _ in logged[f"specbound/{bound}"]] == steps
        assert [s for s, _ in logged[f"specbound/log10_{bound}"]] == steps
        for (step, value), entry in zip(logged[f"specbound/{bound}"], callback.monitor.history):
            assert value == pytest.approx(entry["bounds"][bound], rel=1e-6)  # TensorBoard keeps float32

    records = sorted(Store(tmp_path / "store").records(tables=()), key=lambda r: r.meta["labels"]["step"])
    assert [r.meta["labels"] for r in records] == [
        {"run": "tiny", "step": s, "model": "BertForSequenceClassification"} for s in steps
    ]
    assert records[0].bounds["spectral_adaptive"] != records[-1].bounds["spectral_adaptive"]  # it trained
    # the loss the Trainer logs at an analysed step (after the analysis: logging_steps=2, so step 6 only)
    # is in that step's record; the end-of-training mean (the summary's train_loss) is not
    (logged_loss,) = [e["loss"] for e in trainer.state.log_history if e.get("step") == 6 and "loss" in e]
    assert [r.meta["metrics"] for r in records] == [{}, {}, {"train_loss": pytest.approx(logged_loss)}]

    # the last record is the analysis of the weights the Trainer ends with, saved and read back
    trainer.model.save_pretrained(tmp_path / "final")
    final = specbound.analyze(tmp_path / "final", grid_m=4, threads=1)
    assert records[-1].bounds == pytest.approx(final.all_bounds(), rel=1e-12)
    # compare names the record by its run, step and model, and says the saved weights' analysis (the
    # default grid) was made with other options than the callback's (grid_m=4)
    compared = specbound.compare(f"{tmp_path / 'store'}#tiny/step-6", tmp_path / "final", threads=1)
    assert compared.names[0] == "step-6" and "in-memory" not in str(compared)
    assert compared.analyses["step-6"].source == "tiny/step-6 (BertForSequenceClassification)"
    assert "tiny/step-6 (BertForSequenceClassification)" in str(compared)  # the models table's source
    assert compared.option_differences() == {"grid_m": {compared.names[0]: 4, compared.names[1]: "default"}}
    assert any(e.get("step") == 6 and "specbound/spectral_adaptive" in e for e in trainer.state.log_history)
    err = capsys.readouterr().err
    assert err.count("specbound: one analysis took") == 1 and "a training step" in err  # the cost, said once

    pytest.importorskip("matplotlib")

    capsys.readouterr()
    assert main(["scaling", "--store", str(tmp_path / "store"), "--against", "label_step"]) == 0
    err = capsys.readouterr().err  # step 0 has no logarithm: the fit leaves it out and says so
    assert "left out of the fits in label_step: 1 record(s) with label_step <= 0" in err and "tiny/step-0" in err

    # the report's other figures are tested in tests/report: this one draws the run's trajectory only
    drawn = lambda store, **kw: {"trajectory": figure_trajectory(store, x="label_step")}  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "build_figures", drawn)
        assert main(["report", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "report")]) == 0
    assert "along step" in (tmp_path / "report" / "report.html").read_text()  # the trajectory's section
    assert (tmp_path / "report" / "figures" / "trajectory.png").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(every_n_steps=0), "every_n_steps must be a positive integer"),
        (dict(init="somewhere"), "take no init= option"),
        (dict(bounds=["no_such_bound"]), "bounds must be"),
        (dict(grid_m=-1), "grid_m"),
        (dict(bounds=5), "bounds must be .* found 5"),
        (dict(bounds=None), "bounds must be .* found None"),
        (dict(bounds=[]), "bounds must be"),
        (dict(bounds=[5]), "bounds must be"),
        (dict(bounds=b"edelman"), "bounds"),
        (dict(bounds={"edelman": 1}), "bounds must be"),
        (dict(bounds="edelman"), "bounds must be"),
        (dict(store=5), "store must be a results store folder .* found 5"),
        (dict(store=["a", "b"]), "store must be .* found \\['a', 'b'\\]"),
        (dict(store=""), "store must be"),
        (dict(run_name=5), "run_name must be a non-empty string"),
        (dict(at_start="yes"), "at_start must be True"),
        (dict(quiet=1), "quiet must be True or False"),
        (dict(log_dir=3.5), "log_dir must be the TensorBoard folder"),
    ],
)
def test_bad_arguments_are_one_line_before_training(kwargs, message):
    from specbound.integrations.transformers import SpecboundCallback

    with pytest.raises(SpecboundError, match=message) as err:
        SpecboundCallback(**kwargs)
    assert "\n" not in str(err.value)


def test_the_trainer_metrics_of_a_log():
    from specbound.integrations.transformers import trainer_metrics

    assert trainer_metrics({"loss": 0.5, "grad_norm": 2.0, "learning_rate": 1e-3, "epoch": 1.0}) == {"train_loss": 0.5}
    assert trainer_metrics(
        {
            "eval_loss": 0.7,
            "eval_accuracy": 0.8,
            "eval_runtime": 3.0,
            "eval_samples_per_second": 9.0,
            "eval_steps_per_second": 1.0,
            "epoch": 1.0,
        }
    ) == {"eval_loss": 0.7, "eval_accuracy": 0.8}
    assert trainer_metrics({"train_runtime": 4.0, "train_loss": 1.3, "epoch": 1.0}) == {}  # the run's summary


def test_the_digest_is_the_weights(quiet_transformers):
    a, b = tiny_classifier(), tiny_classifier()
    assert state_digest(a) == state_digest(b)
    import torch

    with torch.no_grad():
        b.classifier.bias[0] += 1e-7
    assert state_digest(a) != state_digest(b)


def test_the_cost_line_is_printed_above_a_progress_bar(capsys):
    """The cost line is not printed inside the Trainer's tqdm bar ("3/40 [...]specbound: one
    analysis took ..."); it is written above the bar, on a line of its own, and a small cost is not
    rounded to "0%"."""

    from tqdm import tqdm

    monitor = BoundMonitor(every_n_steps=2, grid_m=4)
    with tqdm(total=10, file=sys.stderr, ascii=True, mininterval=0) as bar:
        bar.update(3)
        monitor.measure(tiny_classifier(), 2)
        bar.update(1)
    err = capsys.readouterr().err
    (line,) = [part for part in re.split(r"[\r\n]", err) if "one analysis took" in part]
    assert line.startswith("specbound: one analysis took") and "3/10" in err
    assert [share(0.06), share(0.004), share(0.0004)] == ["6%", "0.4%", "under 0.1%"]


def test_the_bounds_reach_weights_and_biases_in_offline_mode(tmp_path, monkeypatch, quiet_transformers):
    """With ``report_to=["wandb"]`` the callback logs each analysis into the Trainer's own W&B run: W&B in offline
    mode (no account, no network), the run's summary (each key's last value) read in the process and its run file
    written to the offline folder."""
    wandb = pytest.importorskip("wandb")
    from specbound.integrations.transformers import SpecboundCallback

    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "specbound-test",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    callback = SpecboundCallback(every_n_steps=EVERY, grid_m=4)
    try:
        _train(tmp_path, callback, report_to=("wandb",))
        run = wandb.run
        assert run is not None and run.settings.mode == "offline"
        summary = dict(run.summary)
    finally:
        wandb.finish()
    last = callback.monitor.history[-1]
    assert [h["step"] for h in callback.monitor.history] == [0, 3, 6]
    for bound in ("spectral_adaptive", "edelman"):  # the run's summary holds each key's last value
        assert summary[f"specbound/{bound}"] == pytest.approx(last["bounds"][bound], rel=1e-12)
    assert summary["train/global_step"] == 6
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))  # written to disk, sent nowhere
