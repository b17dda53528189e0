import os
import shutil

import pytest
from support.numpy_bert import write_tiny_bert
from support.tiny_models import TINY_DEPTHS, TINY_PATTERN, TINY_WIDTHS, build_tiny_model, save_tiny

from specbound.io.default_checkpoint import default_checkpoint
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store
from specbound.tools.miniatures import write_miniatures

# Tests pin BLAS to one thread: test processes side by side otherwise oversubscribe the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def minilm_dir():
    return default_checkpoint()


# Tiny random BERT-family checkpoints (tests/support/tiny_models.py), each saved once per session.


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """``tiny_dir(name, variant="fp32")`` -> folder of a saved tiny model (built once per session).

    ``variant``: ``"fp32"`` (one model.safetensors), ``"sharded"`` (same weights, index + several
    shards), ``"fp16"`` / ``"bf16"`` (``model.half()`` / ``model.to(torch.bfloat16)``).
    """
    root = tmp_path_factory.mktemp("tiny_models")
    built = {}

    def get(name: str, variant: str = "fp32"):
        key = (name, variant)
        if key not in built:
            import torch

            model = build_tiny_model(name)
            folder = root / f"{name}-{variant}"
            if variant == "fp32":
                save_tiny(model, folder)
            elif variant == "sharded":
                save_tiny(model, folder, max_shard_size="20KB")
            elif variant == "fp16":
                save_tiny(model.half(), folder)
            elif variant == "bf16":
                save_tiny(model.to(torch.bfloat16), folder)
            else:
                raise ValueError(f"unknown variant {variant!r}")
            built[key] = folder
        return built[key]

    return get


@pytest.fixture(scope="session")
def tiny_bert_dir(tiny_dir):
    """A tiny BertModel (no name prefix): L=2, N=32, 4 heads, d_ff=48."""
    return tiny_dir("bert")


@pytest.fixture(scope="session")
def tiny_bert_cls_dir(tiny_dir):
    """A tiny BertForSequenceClassification (``bert.`` prefix): L=3, N=48, 4 heads, d_ff=80."""
    return tiny_dir("bert_cls")


@pytest.fixture(scope="session")
def tiny_roberta_dir(tiny_dir):
    """A tiny RobertaForMaskedLM (``roberta.`` prefix, tied lm_head): L=2, N=64, 4 heads, d_ff=96."""
    return tiny_dir("roberta_mlm")


# The tiny BERT-Miniatures-shaped family of the sweep tests (TINY_PATTERN), written with specbound's own writer.


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """Folder holding the six tiny family members as plain model folders."""

    root = tmp_path_factory.mktemp("tiny_family")
    write_miniatures(root, layout="folders", depths=TINY_DEPTHS, widths=TINY_WIDTHS, head_size=16, vocab=32)
    return root


@pytest.fixture(scope="session")
def tiny_store(tiny_family, tmp_path_factory):
    """A results store holding the six tiny family members (a local sweep; never modified by tests)."""

    root = tmp_path_factory.mktemp("tiny_store") / "store"
    report = run_sweep(expand_sources([str(tiny_family / TINY_PATTERN)]), root, progress=False)
    assert len(report.written) == 6, report.summary()
    return Store(root)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """``(trained, init)``: two tiny random BERT folders of the same architecture (L=2, N=16,
    4 heads, d_ff=24)."""

    root = tmp_path_factory.mktemp("numpy_bert")
    return write_tiny_bert(root / "trained", seed=1), write_tiny_bert(root / "init", seed=2)


@pytest.fixture
def healthy(tiny_bert_dir, tmp_path):
    """A writable copy of the tiny BERT checkpoint, for tests that break it."""

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    return folder
