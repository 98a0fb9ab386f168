#!/usr/bin/env python3
"""Reference values for ADAN (plan/ops.def): the Adan update of Xie et al., "Adan:
Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep Models" (arXiv 2208.06677),
in the form of its reference PyTorch implementation (github.com/sail-sg/Adan, adan.py),
here in float64 NumPy, over a few steps of random gradients.

    python3 tests/golden/adan_reference.py OUT.json

Each case has a parameter vector laid out as tunegraph lays out a parameter pool: tensors
at offsets with gaps between them (elements of no parameter, never updated) and tensors
without weight decay (biases, LayerNorm); per step a learning rate, a gradient vector and a
global norm; and the parameters and the four state vectors after each step. Before the
update the gradient is scaled by min(1, max_grad_norm / (norm + 1e-6)) when max_grad_norm >
0 (torch.nn.utils.clip_grad_norm_, as a trainer applies it before the optimizer step; the
reference optimizer's own max_grad_norm is left at 0). On the first step the previous
gradient is the gradient itself. Inputs are float32 values; the JSON holds them exactly.
"""
import json
import sys

import numpy as np


def adan_step(p, m, d, v, g_prev, g, t, lr, b1, b2, b3, eps, wd, no_prox, first):
    """One step of the reference algorithm on float64 arrays (wd per element)."""
    if first:
        g_prev = g.copy()
    diff = g - g_prev
    m = b1 * m + (1 - b1) * g
    d = b2 * d + (1 - b2) * diff
    u = g + b2 * diff
    v = b3 * v + (1 - b3) * u * u
    bc1, bc2, bc3 = 1 - b1 ** t, 1 - b2 ** t, 1 - b3 ** t
    den = np.sqrt(v) / np.sqrt(bc3) + eps
    if no_prox:
        p = p * (1 - lr * wd)
        p = p - (lr / bc1) * m / den - (lr * b2 / bc2) * d / den
    else:
        p = p - (lr / bc1) * m / den - (lr * b2 / bc2) * d / den
        p = p / (1 + lr * wd)
    return p, m, d, v, g.copy()


def f32(rng, n, lo, hi):
    return rng.uniform(lo, hi, n).astype(np.float32).astype(np.float64)


def make_case(name, seed, b1, b2, b3, eps, wd, no_prox, max_norm, steps):
    rng = np.random.default_rng(seed)
    n = 40
    # (first element, count, decay): gaps at 7..9, 21, 30..31 and 38..39.
    tensors = [(0, 7, 1), (10, 11, 0), (22, 8, 1), (32, 6, 0)]
    member = np.zeros(n, dtype=bool)
    wd_of = np.zeros(n)
    for first, count, decay in tensors:
        member[first:first + count] = True
        wd_of[first:first + count] = wd if decay else 0.0
    p0 = f32(rng, n, -1.0, 1.0)
    p, m, d, v, gp = p0.copy(), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    out = {"name": name, "beta1": b1, "beta2": b2, "beta3": b3, "eps": eps, "weight_decay": wd,
           "no_prox": no_prox, "max_grad_norm": max_norm, "tensors": [list(x) for x in tensors],
           "params": p0.tolist(), "steps": []}
    for k in range(steps):
        t = k + 1
        lr = float(np.float32(rng.uniform(1e-3, 5e-2)))
        g = f32(rng, n, -2.0, 2.0)
        norm = float(np.float32(rng.uniform(0.5, 4.0)))
        clip = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
        # The clip factor is a float32 in the kernels: applied as such here too.
        gc = g * float(np.float32(clip))
        np_, nm, nd, nv, ngp = adan_step(p, m, d, v, gp, gc, t, lr, b1, b2, b3, eps, wd_of, no_prox, t == 1)
        p = np.where(member, np_, p)
        m, d, v, gp = (np.where(member, x, y) for x, y in ((nm, m), (nd, d), (nv, v), (ngp, gp)))
        out["steps"].append({"t": t, "lr": lr, "norm": norm, "grads": g.tolist(), "params": p.tolist(),
                             "m": m.tolist(), "d": d.tolist(), "v": v.tolist(), "g_prev": gp.tolist()})
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: adan_reference.py OUT.json")
    f = lambda x: float(np.float32(x))  # the plan holds the hyperparameters as float32
    cases = [
        make_case("reference defaults, prox decay, clipped", 1, f(0.98), f(0.92), f(0.99), f(1e-8), f(0.02), 0, f(1.0), 5),
        make_case("no_prox decay, no clipping", 2, f(0.98), f(0.92), f(0.99), f(1e-8), f(0.05), 1, 0.0, 5),
        make_case("other betas, large eps, clip above the norms", 3, f(0.9), f(0.8), f(0.999), f(1e-3), 0.0, 0,
                  f(10.0), 4),
    ]
    with open(sys.argv[1], "w") as out:
        json.dump({"numpy": np.__version__, "cases": cases}, out)
    print(f"{len(cases)} cases -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
