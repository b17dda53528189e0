import os

import pytest

# Tests pin BLAS to one thread: two processes on two cores otherwise thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def minilm_dir():
    from specbound.io.default_checkpoint import default_checkpoint

    return default_checkpoint()


# ---------------------------------------------------------------------------------------------
# Tiny random BERT-family checkpoints, built with `transformers` and saved with its own
# save_pretrained (safetensors).  Nothing is committed: every folder lives in a session tmp dir.
# torch/transformers are imported only inside the builders, so tests that do not use these
# fixtures never pay for the import.
# ---------------------------------------------------------------------------------------------

# name -> (model class, config class, config overrides, seed, expected tensor-name prefix).
# d_ff differs from N and 4N so that a transposed feed-forward weight cannot go unnoticed.  The
# init scale (BERT's default is 0.02) is chosen per model so that the grid minimisers p* are spread
# over (0, 2) rather than all at one end: the oracle comparison then exercises every branch.
TINY_MODELS = {
    "bert": ("BertModel", "BertConfig",
             dict(hidden_size=32, num_hidden_layers=2, intermediate_size=48, initializer_range=0.08), 0, ""),
    "bert_cls": ("BertForSequenceClassification", "BertConfig",
                 dict(hidden_size=48, num_hidden_layers=3, intermediate_size=80, num_labels=3,
                      initializer_range=0.06), 1, "bert."),
    "roberta_mlm": ("RobertaForMaskedLM", "RobertaConfig",
                    dict(hidden_size=64, num_hidden_layers=2, intermediate_size=96, initializer_range=0.06),
                    2, "roberta."),
}


def build_tiny_model(name: str):
    """The torch module of ``TINY_MODELS[name]``, randomly initialised with a fixed seed (fp32)."""
    import torch
    import transformers

    model_cls, config_cls, overrides, seed, _ = TINY_MODELS[name]
    config = getattr(transformers, config_cls)(
        num_attention_heads=4, vocab_size=64, max_position_embeddings=40, type_vocab_size=2, **overrides,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    return model.eval()


def save_tiny(model, folder, **kwargs):
    """``model.save_pretrained(folder)`` (safetensors), quietly; returns ``folder``."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(folder), safe_serialization=True, **kwargs)
    return folder


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


# ---------------------------------------------------------------------------------------------
# A tiny BERT-Miniatures-shaped family for sweeps: L in {1, 2, 3} x N in {32, 64}, heads of size 16,
# d_ff = 4N, written with specbound's own writer (random, BERT's std 0.02).
# ---------------------------------------------------------------------------------------------

TINY_DEPTHS = (1, 2, 3)
TINY_WIDTHS = (32, 64)
TINY_PATTERN = "bert_uncased_L-{1..3}_H-{32..64}_A-{H/16}"


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """Folder holding the six tiny family members as plain model folders."""
    from specbound.tools.miniatures import write_miniatures

    root = tmp_path_factory.mktemp("tiny_family")
    write_miniatures(root, layout="folders", depths=TINY_DEPTHS, widths=TINY_WIDTHS, head_size=16, vocab=32)
    return root


@pytest.fixture(scope="session")
def tiny_store(tiny_family, tmp_path_factory):
    """A results store holding the six tiny family members (a local sweep; never modified by tests)."""
    from specbound.sweep.sources import expand_sources
    from specbound.sweep.store import Store
    from specbound.sweep.run import run_sweep

    root = tmp_path_factory.mktemp("tiny_store") / "store"
    report = run_sweep(expand_sources([str(tiny_family / TINY_PATTERN)]), root, progress=False)
    assert len(report.written) == 6, report.summary()
    return Store(root)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """``(trained, init)``: two tiny random BERT folders of the same architecture (L=2, N=16,
    4 heads, d_ff=24)."""
    from numpy_bert import write_tiny_bert

    root = tmp_path_factory.mktemp("numpy_bert")
    return write_tiny_bert(root / "trained", seed=1), write_tiny_bert(root / "init", seed=2)


@pytest.fixture
def healthy(tiny_bert_dir, tmp_path):
    """A writable copy of the tiny BERT checkpoint, for tests that break it."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    return folder
