"""The study's models: Hugging Face ``transformers`` classes built from a config, so that
``save_pretrained`` writes an ordinary checkpoint that :func:`specbound.analyze` reads like any other.

* ``fmnist``: ``ViTForImageClassification`` on 28 x 28 one-channel images, 7 x 7 patches
  (16 patch tokens + ``[CLS]``).
* ``langid`` and ``fortunes``: ``BertForSequenceClassification`` over characters (``[CLS]`` + up
  to 20 or 48 characters).

Both use GELU, 4 attention heads, a feed-forward width of ``ff_mult * width``, dropout ``dropout``
on the hidden states and the attention probabilities (a grid axis; 0 by default) and the libraries'
default initialisation (normal, std 0.02).  torch and transformers are imported here and nowhere on
``import specbound``.
"""

from __future__ import annotations

import math

import torch  # noqa: TID253 -- the study's models: imported by study.train only, with torch installed
import transformers  # noqa: TID253

PATCH_SIZE = 7
TEXT_TASKS = ("langid", "fortunes")


def build_model(
    task: str, *, depth: int, width: int, heads: int, ff_mult: int, num_labels: int, meta: dict, dropout: float = 0.0
) -> torch.nn.Module:
    """A freshly initialised classifier for ``task`` (call ``torch.manual_seed`` first)."""
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" on every save
    common = dict(
        hidden_size=width,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        intermediate_size=ff_mult * width,
        hidden_act="gelu",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=num_labels,
    )
    if task == "fmnist":
        config = transformers.ViTConfig(image_size=meta["image_size"], patch_size=PATCH_SIZE, num_channels=1, **common)
        return transformers.ViTForImageClassification(config)
    if task in TEXT_TASKS:
        config = transformers.BertConfig(
            vocab_size=meta["vocab_size"],
            max_position_embeddings=meta["max_len"],
            type_vocab_size=1,
            pad_token_id=0,
            classifier_dropout=dropout,
            **common,
        )
        return transformers.BertForSequenceClassification(config)
    raise ValueError(f"unknown task {task!r}")


def head_matrices(model: torch.nn.Module) -> list[torch.Tensor]:
    """The linear maps between the last analysed block and the logits: ViT's classifier; BERT's
    pooler dense layer (then tanh, 1-Lipschitz) and classifier.  Normalisation gains are left out,
    as everywhere in specbound (docs/bounds.md section 0): they are in the observed row norms."""
    if isinstance(model, transformers.BertForSequenceClassification):
        return [model.bert.pooler.dense.weight, model.classifier.weight]
    return [model.classifier.weight]


def head_lipschitz(model: torch.nn.Module) -> float:
    """Lipschitz constant of the margin ``f_y - f_j`` as a function of the row the head reads:
    ``||w_y - w_j|| <= sqrt(2) ||W_c||_2`` times the spectral norms of the layers before the
    classifier."""
    with torch.no_grad():
        norms = [torch.linalg.matrix_norm(w.double(), ord=2).item() for w in head_matrices(model)]
    return math.sqrt(2.0) * math.prod(norms)


def _inputs(task: str, x: torch.Tensor) -> dict:
    if task == "fmnist":
        return {"pixel_values": x}
    mask = x != 0
    width = int(mask.sum(dim=1).max())  # trimmed to the batch's longest input
    return {"input_ids": x[:, :width], "attention_mask": mask[:, :width].long()}


def forward_logits(model: torch.nn.Module, task: str, x: torch.Tensor) -> torch.Tensor:
    """Logits for a batch of inputs as stored by :mod:`.data` (images already normalised for
    ``fmnist``; token ids for the text tasks, padding masked and trimmed to the batch's longest)."""
    return model(**_inputs(task, x)).logits


def forward_with_rows(model: torch.nn.Module, task: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits (B, C), rows (B, width))``: the logits and the ``[CLS]`` row the head reads, i.e.
    the last block's output row (after ViT's final LayerNorm; BERT's last block ends in one).
    The gap bounds measure the network up to this row, so its observed norm sets the margin's scale."""
    out = model(**_inputs(task, x), output_hidden_states=True)
    rows = out.hidden_states[-1][:, 0]
    if task == "fmnist":  # ViT's hidden_states are before the final LayerNorm that the classifier reads
        rows = model.vit.layernorm(rows)
    return out.logits, rows
