"""Tiny random checkpoints built with ``transformers`` and saved with its own ``save_pretrained``
(nothing is committed: the fixtures of ``tests/conftest.py`` write them to session folders), and the
shape of the tiny BERT-Miniatures family the sweep tests use.

torch/transformers are imported only inside the builders, so tests that do not build a model never
pay for the import.
"""

# name -> (model class, config class, config overrides, seed, expected tensor-name prefix).
# d_ff differs from N and 4N so that a transposed feed-forward weight cannot go unnoticed.  The
# init scale (BERT's default is 0.02) is chosen per model so that the grid minimisers p* are spread
# over (0, 2) rather than all at one end: the oracle comparison then exercises every branch.
TINY_MODELS = {
    "bert": (
        "BertModel",
        "BertConfig",
        dict(hidden_size=32, num_hidden_layers=2, intermediate_size=48, initializer_range=0.08),
        0,
        "",
    ),
    "bert_cls": (
        "BertForSequenceClassification",
        "BertConfig",
        dict(hidden_size=48, num_hidden_layers=3, intermediate_size=80, num_labels=3, initializer_range=0.06),
        1,
        "bert.",
    ),
    "roberta_mlm": (
        "RobertaForMaskedLM",
        "RobertaConfig",
        dict(hidden_size=64, num_hidden_layers=2, intermediate_size=96, initializer_range=0.06),
        2,
        "roberta.",
    ),
}


def build_tiny_model(name: str):
    """The torch module of ``TINY_MODELS[name]``, randomly initialised with a fixed seed (fp32)."""
    import torch
    import transformers

    model_cls, config_cls, overrides, seed, _ = TINY_MODELS[name]
    config = getattr(transformers, config_cls)(
        num_attention_heads=4,
        vocab_size=64,
        max_position_embeddings=40,
        type_vocab_size=2,
        **overrides,
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


# A tiny BERT-Miniatures-shaped family for sweeps: L in {1, 2, 3} x N in {32, 64}, heads of size 16,
# d_ff = 4N, written with specbound's own writer (random, BERT's std 0.02).
TINY_DEPTHS = (1, 2, 3)
TINY_WIDTHS = (32, 64)
TINY_PATTERN = "bert_uncased_L-{1..3}_H-{32..64}_A-{H/16}"
