"""Structures a family brings beyond the paper's BERT chain, named by its spec's ``"assumptions"`` list
(the family's data file says which apply) and listed, applying, in every analysis of that family
(:mod:`specbound.assumptions`): name -> ``(kind, effect)``, kind as there (``theorem``, ``extension``
or ``convention``).
"""

from __future__ import annotations

STRUCTURES = {
    "relative_position_bias": (
        "convention",
        "a learned relative position bias is added to the attention logits (MPNet, T5): it does not depend on the "
        "input, so the logit differences the softmax argument uses, and with them every Lipschitz factor and "
        "sensitivity, are unchanged; the bias table is outside the complexity like every bias"),
    "layer_scale_folded": (
        "convention",
        "the LayerScale vectors lambda are folded exactly into the OV and FF_out matrices (W diag(lambda)): the "
        "bounds see the scaled matrices, and lambda is not counted as a parameter of its own"),
    "front_end_as_embedding": (
        "theorem",
        "the convolutional front-end (wav2vec2/HuBERT's feature extractor, projection and convolutional position "
        "embedding; Whisper's two convolutions) is the embedding, like a tokenizer: fixed, outside the complexity, "
        "the encoder's input rows are its output"),
    "rotary_layer_types": (
        "extension",
        "layers of several types rotate with their own base (ModernBERT's global and local layers): each layer's QK "
        "quantities hold at every offset of the whole context under its own layout, a sliding window's layers "
        "included (a superset of the offsets they see; docs/rotary.md)"),
    "disentangled_attention": (
        "extension",
        "DeBERTa's content-to-position and position-to-content logit terms reuse each head's QK matrix on the "
        "relative position embeddings, of norm at most 1 under normalisation_as_projection: with n such terms "
        "Lambda has c(OV)(1 + 2(2 + n) c(QK)) per head and gamma*_QK = 2(1 + n) c(OV) times the feed-forward "
        "factor (our derivation, docs/theory.md 3d); the position embeddings are outside the complexity"),
    "encoder_decoder_chain": (
        "extension",
        "an encoder-decoder is read as two chains joined by cross-attention: a decoder layer's Lambda multiplies "
        "its self-attention, its cross-attention in the decoder's stream (2 sum_h c(OV) c(QK)) and its "
        "feed-forward; the encoder's output reaches the decoder's output through every cross-attention (keys and "
        "values: sum_h c(OV)(1 + 2 c(QK)) times the feed-forward), so an encoder layer's alpha carries "
        "Z = sum_j alpha_j M_j; every matrix of both stacks is one term of the bound over L_e + L_d layers (our "
        "derivation, docs/theory.md 3e)"),
    "two_tower": (
        "convention",
        "a two-tower model (CLIP, SigLIP) is bounded tower by tower, each a chain of its own with its own L, "
        "alphas and bound; the projection heads (SigLIP's attention-pooling head too) and the logit scale are "
        "outside the bound like a classifier head, and the similarity score that couples the towers is bounded "
        "by neither number"),
}
