"""An independent log-space oracle for the headline bounds at any depth (docs/spec.md sections 2-5),
from dense row-oriented matrices: every product and every power is taken in logs, written here
without any of specbound's code, so deep models whose factors overflow float64 can be checked."""

import math

import numpy as np

L_PHI_SILU, L_PHI_GELU = 1.0998, 1.13


def _lse(x):
    x = np.asarray(x, dtype=np.float64)
    top = np.max(x)
    return float(top + np.log(np.sum(np.exp(x - top))))


def log_bounds(rows, *, L, N, heads, block="sequential", l_phi=L_PHI_GELU, rank_tol=1e-10):
    """``{"adaptive": value, "log_edelman": ln B, "log_fixed_p2": ln B}`` from ``rows``: per layer a
    list of ``(role, matrix)`` (QK heads, OV heads, FF matrices; row-vector orientation)."""
    per_layer = [rows[i * len(rows) // L : (i + 1) * len(rows) // L] for i in range(L)]
    svals = [[(role, np.linalg.svd(m, compute_uv=False), m) for role, m in layer] for layer in per_layer]
    log_lambda, info = [], []
    for layer in svals:
        c = {}
        for role, s, m in layer:
            c.setdefault(role, []).append(s[0])
        qk, ov = np.array(c["QK"]), np.array(c["OV"])
        attention = float(np.sum(ov * (1 + 4 * qk)))
        if "FF_gate" in c:
            g, u, d = c["FF_gate"][0], c["FF_up"][0], c["FF_out"][0]
            ff, ff_unit = (l_phi + 1.0) * g * u * d, 2.0 * g * u * d
            gam_ff = {"FF_gate": u * d, "FF_up": g * d, "FF_out": 1.0}
        else:
            i_, o_ = c["FF_in"][0], c["FF_out"][0]
            ff, ff_unit = l_phi * i_ * o_, i_ * o_
            gam_ff = {"FF_in": o_, "FF_out": 1.0}
        after = 1.0 if block == "parallel" else ff_unit
        log_lambda.append(math.log(attention + ff) if block == "parallel" else math.log(attention) + math.log(ff))
        gam = {"QK": list(2 * ov * after), "OV": [after] * len(ov), **{k: [v] for k, v in gam_ff.items()}}
        info.append(gam)
    log_alpha = [sum(log_lambda[k] for k in range(l + 1, L)) for l in range(L)]
    m = math.ceil(L + math.log(max(N, 2)))
    grid = np.arange(2 * m + 1) / m
    adaptive, p2_logs, edelman_terms = 0.0, [], []
    for l, layer in enumerate(svals):
        seen = {}
        xi_logs = []
        for role, s, mat in layer:
            i = seen.get(role, 0)
            seen[role] = i + 1
            g = info[l][role][i]
            log_scale = math.log(g) + log_alpha[l] + math.log(L)
            tau = rank_tol * min(mat.shape) * max(s[0], 1.0)
            kept = s[s > tau]
            logs = []
            for p in grid:
                sp = kept.size if p == 0 else float(np.sum(kept**p))
                logs.append((math.log(sp) + (p * log_scale if p else 0.0) + (p + 1) * math.log(N)) / (p + 2))
            adaptive += math.exp(min(logs))
            p2_logs.append(logs[-1])
            col = float(np.sum(np.linalg.norm(mat, axis=0)))
            w = g / 2 if role == "QK" else g
            xi_logs.append((2 / 3) * (math.log(w) + math.log(col)))
        edelman_terms.append((2 / 3) * log_alpha[l] + _lse(xi_logs))
    return {
        "adaptive": adaptive + math.sqrt(L),
        "log_edelman": 1.5 * _lse(edelman_terms + [0.0]),
        "log_fixed_p2": _lse(p2_logs + [0.5 * math.log(L)]),
    }
