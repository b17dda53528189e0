"""Lower bounds on a function's Lipschitz constant found by gradient ascent, for the brute-force
checks of the derivations (docs/theory.md 3h, 3i): the norm of a sequence is the largest norm of
its rows, as in the theorem's factors."""

from __future__ import annotations

import numpy as np


def unit_rows(shape, norm, gen):
    """Random rows of the given norm, float64."""
    import torch

    a = torch.randn(*shape, dtype=torch.float64, generator=gen)
    return norm * a / a.norm(dim=-1, keepdim=True)


def measured_lipschitz(f, shapes, moved, eps=1e-4, restarts=2, steps=30, seed=0):
    """Largest ``max_t ||f(u + du)_t - f(u)_t|| / max_s ||du_s||`` found by gradient ascent: ``shapes``
    the inputs' shapes, ``moved`` which of them are perturbed (rows of norm ``eps``); every input row of
    norm ``1 - eps``, so that the moved ones stay in the unit ball."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    best = 0.0
    for _ in range(restarts):
        base = [unit_rows(s, 1.0, gen).requires_grad_() for s in shapes]
        dirs = [unit_rows(shapes[i], 1.0, gen).requires_grad_() for i in moved]
        opt = torch.optim.Adam(base + dirs, lr=0.1)
        for _ in range(steps):
            u = [(1 - eps) * b / b.norm(dim=-1, keepdim=True) for b in base]
            moved_u = list(u)
            for i, d in zip(moved, dirs):
                moved_u[i] = u[i] + eps * d / d.norm(dim=-1, keepdim=True)
            ratio = (f(*moved_u) - f(*u)).norm(dim=-1).max() / eps
            best = max(best, float(ratio.detach()))
            opt.zero_grad()
            (-ratio).backward()
            opt.step()
    return best


def attention_factor(analysis, layer: int) -> float:
    """The attention factor the analysis reports for ``layer``: ``sum_h c(OV_h)(1 + 4 c(QK_h))`` over its
    QK and OV rows."""

    rows = analysis.matrices[analysis.matrices["layer"] == layer]
    c_qk = rows[rows["role"] == "QK"]["spectral_norm"].to_numpy()
    c_ov = rows[rows["role"] == "OV"]["spectral_norm"].to_numpy()
    return float(np.sum(c_ov * (1 + 4 * c_qk)))


def measured_attention(model, layer: int, tokens: int, **ascent) -> float:
    """:func:`measured_lipschitz` of a decoder's ``model.model.layers[layer].self_attn`` module over
    ``tokens`` token rows, with the model's own rotary embedding at positions ``0 .. tokens - 1`` and no
    mask; ``ascent``: the keywords of :func:`measured_lipschitz` (restarts, steps, seed)."""
    import torch

    attn = model.model.layers[layer].self_attn
    pos = torch.arange(tokens)[None]

    def f(x):
        out = attn(x[None], position_embeddings=model.model.rotary_emb(x[None], pos), attention_mask=None)[0]
        return out[0]

    return measured_lipschitz(f, [(tokens, model.config.hidden_size)], [0], **ascent)
