"""The study's models: Hugging Face ``transformers`` classes built from a config, so that
``save_pretrained`` writes an ordinary checkpoint that :func:`specbound.analyze` reads like any other.

* ``fmnist``: ``ViTForImageClassification`` on 28 x 28 one-channel images, 7 x 7 patches
  (16 patch tokens + ``[CLS]``).
* ``langid``: ``BertForSequenceClassification`` over characters (``[CLS]`` + up to 20 characters).

Both use GELU, ``heads`` attention heads, a feed-forward width of ``ff_mult * width``, no dropout
(so that the grid's own regularisers, data size, weight decay and training length, are the only
ones) and the libraries' default initialisation (normal, std 0.02).  torch and transformers are
imported here and nowhere on ``import specbound``.
"""

from __future__ import annotations

import math

import torch
import transformers

PATCH_SIZE = 7


def build_model(task: str, *, depth: int, width: int, heads: int, ff_mult: int, num_labels: int,
                meta: dict) -> torch.nn.Module:
    """A freshly initialised classifier for ``task`` (call ``torch.manual_seed`` first)."""
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" on every save
    common = dict(hidden_size=width, num_hidden_layers=depth, num_attention_heads=heads,
                  intermediate_size=ff_mult * width, hidden_act="gelu", hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, num_labels=num_labels)
    if task == "fmnist":
        config = transformers.ViTConfig(image_size=meta["image_size"], patch_size=PATCH_SIZE, num_channels=1,
                                        **common)
        return transformers.ViTForImageClassification(config)
    if task == "langid":
        config = transformers.BertConfig(vocab_size=meta["vocab_size"], max_position_embeddings=meta["max_len"],
                                         type_vocab_size=1, pad_token_id=0, **common)
        return transformers.BertForSequenceClassification(config)
    raise ValueError(f"unknown task {task!r}")


def head_matrices(model: torch.nn.Module) -> list[torch.Tensor]:
    """The linear maps between the last analysed block and the logits: ViT's classifier; BERT's
    pooler dense layer (then tanh, 1-Lipschitz) and classifier.  Normalisation gains are left out,
    as everywhere in specbound (docs/bounds.md section 0)."""
    if isinstance(model, transformers.BertForSequenceClassification):
        return [model.bert.pooler.dense.weight, model.classifier.weight]
    return [model.classifier.weight]


def head_lipschitz(model: torch.nn.Module) -> float:
    """Lipschitz constant of the margin ``f_y - f_j`` as a function of the last block's output row:
    ``||w_y - w_j|| <= sqrt(2) ||W_c||_2`` times the spectral norms of the layers before the
    classifier.  Dividing a logit margin by it gives a margin in the units the bounds assume."""
    with torch.no_grad():
        norms = [torch.linalg.matrix_norm(w.double(), ord=2).item() for w in head_matrices(model)]
    return math.sqrt(2.0) * math.prod(norms)


def forward_logits(model: torch.nn.Module, task: str, x: torch.Tensor) -> torch.Tensor:
    """Logits for a batch of inputs as stored by :mod:`.data` (images already normalised for
    ``fmnist``; token ids for ``langid``, padding masked and trimmed to the batch's longest word)."""
    if task == "fmnist":
        return model(pixel_values=x).logits
    mask = x != 0
    width = int(mask.sum(dim=1).max())
    return model(input_ids=x[:, :width], attention_mask=mask[:, :width].long()).logits
