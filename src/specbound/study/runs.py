"""One folder per run, written atomically: the study's resumable record store.

Layout of ``<out>/runs/<task>-<key>/`` (``key``: hash of the run's hyper-parameters,
:attr:`.grid.RunConfig.key`)::

    config.json          the RunConfig, the key, STUDY_VERSION, the specbound version
    metrics.json         train/test loss and error, gaps, margin, timings (train.py)
    train_margins.npy    every training example's logit margin (float32)
    init/  model/        Hugging Face checkpoints (config.json + model.safetensors) before/after training
    analysis.json        specbound.analyze(model/, init=init/, n=, margin=).to_dict()

Training writes into ``runs/.tmp-<name>-<pid>-<random>/`` and renames it to ``runs/<name>/`` only when
everything above but ``analysis.json`` is there, so a killed run leaves no record, only a temp
folder that the next start removes.  ``analysis.json`` is added afterwards, itself written to a
temp file and renamed; a run without it is analysed on the next start (``reanalyze`` redoes all).
A re-run therefore skips every finished run.  The study's own small design, independent of any
general results store.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .. import __version__
from ..atomic import atomic_write, remove_stale, temp_path
from ..errors import SpecboundError
from ..pipeline import analyze
from .data import load_task
from .grid import STUDY_VERSION, RunConfig

RUNS_DIR = "runs"
TMP_PREFIX = ".tmp-"
FILES = ("config.json", "metrics.json", "train_margins.npy", "init", "model")


def run_path(root: Path, config: RunConfig) -> Path:
    return Path(root) / RUNS_DIR / config.name


def is_trained(path: Path) -> bool:
    return all((path / f).exists() for f in FILES)


def write_json_atomic(path: Path, doc: dict) -> None:
    """``json.dump`` to a temp file in the same folder, then rename: never a half file."""

    def dump(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, allow_nan=True)

    atomic_write(path, dump)


def remove_stale_temps(root: Path) -> list[Path]:
    """Delete temp folders left by killed runs (those whose process is gone)."""
    runs = Path(root) / RUNS_DIR
    return remove_stale(runs.glob(f"{TMP_PREFIX}*")) if runs.is_dir() else []


def train_and_record(config: RunConfig, root: Path) -> bool:
    """Train ``config`` unless its record exists; return whether it trained."""
    from .train import train_run

    final = run_path(root, config)
    if is_trained(final):
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final.parent, f"{TMP_PREFIX}{config.name}")
    tmp.mkdir()
    try:
        start = time.perf_counter()
        (tmp / "config.json").write_text(
            json.dumps(
                {
                    "key": config.key,
                    "study_version": STUDY_VERSION,
                    "specbound_version": __version__,
                    "config": config.to_dict(),
                },
                indent=1,
            )
        )
        metrics = train_run(config, load_task(config.task), tmp)
        metrics["run_seconds"] = time.perf_counter() - start
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
        if final.exists():  # a half-written folder cannot be here (renames are atomic): a finished twin
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def analyze_record(config: RunConfig, root: Path, *, reanalyze: bool = False, threads: int = 1) -> bool:
    """Write ``analysis.json`` for a trained run (unless present); return whether it analysed.

    Every bound and measure comes from :func:`specbound.analyze` on the saved checkpoint, with the
    initial weights (``init=``: the distance-from-initialisation forms), the training-set size and
    the run's margin (the gap bounds), exactly as ``specbound analyze model/ --init init/ --n N
    --margin GAMMA`` would compute them."""
    path = run_path(root, config)
    target = path / "analysis.json"
    if target.exists() and not reanalyze:
        return False
    metrics = json.loads((path / "metrics.json").read_text())
    margin = metrics["margin"]
    gap = {"n": config.train_size, "margin": margin} if margin > 0 else {}  # NaN when nothing was learnt
    start = time.perf_counter()
    result = analyze(path / "model", init=path / "init", threads=threads, jobs=1, **gap)  # runs side by side
    doc = result.to_dict()
    doc["source"], doc["options"]["init"] = "model", "init"  # relative: the folder may move
    doc["analysis_seconds"] = time.perf_counter() - start
    write_json_atomic(target, doc)
    return True


def load_record(path: Path) -> dict:
    """A finished run's config, metrics and analysis (``None`` if not analysed yet)."""
    config = json.loads((path / "config.json").read_text())
    metrics = json.loads((path / "metrics.json").read_text())
    analysis_file = path / "analysis.json"
    analysis = json.loads(analysis_file.read_text()) if analysis_file.exists() else None
    return {
        "path": str(path),
        "key": config["key"],
        "config": config["config"],
        "metrics": metrics,
        "analysis": analysis,
    }


def load_records(root: Path, configs: list[RunConfig] | None = None) -> list[dict]:
    """Records of ``configs`` (default: every finished run under ``root``), in that order."""
    runs = Path(root) / RUNS_DIR
    if configs is None:
        paths = sorted(p for p in runs.glob("*") if not p.name.startswith(TMP_PREFIX) and is_trained(p))
    else:
        paths = [run_path(root, c) for c in configs]
        missing = [p.name for p in paths if not is_trained(p)]
        if missing:
            raise SpecboundError(
                f"{len(missing)} runs have no record under {runs} (e.g. {missing[0]}); run the study to train them"
            )
    return [load_record(p) for p in paths]
