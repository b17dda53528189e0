"""An independent dense reference for BERT-shaped checkpoints, written straight from SPEC.md.

Every per-head QK and OV matrix is materialised (N x N) and decomposed with numpy's SVD, the way
the paper's reference code works; propagation factors and both bounds are recomputed here from
scratch.  It shares no code with specbound beyond numpy, so it can serve as the tests' oracle.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def _rank_and_kept(s, tol):
    tau = tol * len(s) * max(s[0] if len(s) else 0.0, 1.0)
    kept = s[s > tau]
    return kept.size, kept


def dense_reference(folder, prefix="", l_phi=1.13, rank_tol=1e-10, m=None):
    """Return ``(bounds, rows)``: the two bounds and one dict per matrix (layer, head, role, ...)."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    L, N, H = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    d = N // H
    m = m or math.ceil(L + math.log(max(N, 2)))
    grid = [i / m for i in range(2 * m + 1)]

    def t(layer, name):
        return w[f"{prefix}encoder.layer.{layer}.{name}.weight"]

    layers = []
    for l in range(L):
        q, k, v = t(l, "attention.self.query"), t(l, "attention.self.key"), t(l, "attention.self.value")
        out = t(l, "attention.output.dense")
        mats = []
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            mats.append(("QK", h, q[sl, :].T @ k[sl, :]))
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            mats.append(("OV", h, v[sl, :].T @ out.T[sl, :]))
        mats.append(("FF_in", None, t(l, "intermediate.dense").T))
        mats.append(("FF_out", None, t(l, "output.dense").T))
        layers.append([(role, head, W, np.linalg.svd(W, compute_uv=False)) for role, head, W in mats])

    def c(l, role, head=None):
        return next(s[0] for r, h, _, s in layers[l] if r == role and h == head)

    lam = [
        l_phi * c(k, "FF_in") * c(k, "FF_out") * sum(c(k, "OV", h) * (1 + 4 * c(k, "QK", h)) for h in range(H))
        for k in range(L)
    ]
    alpha = [float(np.prod(lam[l + 1 :])) for l in range(L)]

    rows, total, xi_sum = [], 0.0, 0.0
    for l in range(L):
        cin, cout = c(l, "FF_in"), c(l, "FF_out")
        xi = 0.0
        for role, head, W, s in layers[l]:
            gamma = {
                "QK": lambda: 2 * c(l, "OV", head) * cout * cin,
                "OV": lambda: cout * cin,
                "FF_in": lambda: cout,
                "FF_out": lambda: 1.0,
            }[role]()
            scale = max(gamma * alpha[l] * L, np.finfo(float).tiny)
            r, kept = _rank_and_kept(s, rank_tol)
            cs = []
            for p in grid:
                sp = r if p == 0 else float(np.sum(kept**p))
                cs.append(sp ** (1 / (p + 2)) * scale ** (p / (p + 2)) * N ** ((p + 1) / (p + 2)))
            best = int(np.argmin(cs))
            total += cs[best]
            n21 = float(np.linalg.norm(W, axis=0).sum())
            rows.append(
                dict(
                    layer=l,
                    head=head,
                    role=role,
                    rank=r,
                    spectral_norm=s[0],
                    frobenius_norm=float(np.linalg.norm(W)),
                    nuclear_norm=float(kept.sum()),
                    stable_rank=float((s**2).sum() / s[0] ** 2),
                    norm_2_1=n21,
                    norm_1_1=float(np.abs(W).sum()),
                    downstream_factor=alpha[l],
                    gamma=gamma,
                    p_star=grid[best],
                    contribution=cs[best],
                    c_p0=cs[0],
                    c_p2=cs[-1],
                )
            )
            if role == "QK":
                xi += (cout * cin * c(l, "OV", head) * n21) ** (2 / 3)
            elif role == "OV":
                xi += (cout * cin * n21) ** (2 / 3)
            elif role == "FF_in":
                xi += (cout * n21) ** (2 / 3)
            else:
                xi += n21 ** (2 / 3)
        xi_sum += alpha[l] ** (2 / 3) * xi
    bounds = {"spectral_adaptive": total + math.sqrt(L), "edelman": (1 + xi_sum) ** 1.5}
    return bounds, rows
