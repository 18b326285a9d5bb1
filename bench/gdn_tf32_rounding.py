"""How far the tensor-core GDN scan's tf32 operand rounding moves the delta rule (CPU only, float64 numpy).

Runs the chunked form exactly as gdn_prefill.cu's tensor-core scan computes it (u = U0 - W S, o = e^G Q S + P u,
S = e^{G_L} S + K^T (e^{G_L - G} u)) with the operands of those four products rounded to nearest tf32 and every
sum exact, against the token-by-token recurrence in float64, on the inputs tests/gpu draws (gdn_rule_inputs).
Prints the largest error of the outputs and of the final state as a fraction of the largest |value|: the figure
the GPU tests' bound (GDN_TF32_REL) is set against. `--exact` checks the emulation itself (errors ~1e-15).

    python bench/gdn_tf32_rounding.py --heads 16 48 --dims 128 128 --tokens 1000 --seed 1
"""

from __future__ import annotations

import argparse

import numpy as np

CHUNK = 64


def tf32(x: np.ndarray) -> np.ndarray:
    """Round to nearest tf32 (10 explicit mantissa bits, ties away from zero, as cvt.rna.tf32.f32)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32).astype(np.float64)


def inputs(rng, hk, hv, dk, dv, n):
    def l2(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q = l2(rng.standard_normal((n, hk, dk))) * dk ** -0.5
    k = l2(rng.standard_normal((n, hk, dk)))
    v = rng.standard_normal((n, hv, dv))
    g = -np.abs(rng.standard_normal((n, hv))) * 0.3
    beta = rng.random((n, hv))
    state = rng.standard_normal((hv, dk, dv)) * 0.1
    return q, k, v, g, beta, state


def recurrent(q, k, v, g, beta, state):
    n, hk, _ = q.shape
    hv = v.shape[1]
    S, out = state.copy(), np.zeros(v.shape)
    for t in range(n):
        for j in range(hv):
            h = j // (hv // hk)
            S[j] *= np.exp(g[t, j])
            delta = beta[t, j] * (v[t, j] - S[j].T @ k[t, h])
            S[j] += np.outer(k[t, h], delta)
            out[t, j] = S[j].T @ q[t, h]
    return out, S


def chunked(q, k, v, g, beta, state, rnd):
    n, hk, _ = q.shape
    hv = v.shape[1]
    S, out = state.copy(), np.zeros(v.shape)
    for j in range(hv):
        h = j // (hv // hk)
        for c0 in range(0, n, CHUNK):
            r = min(CHUNK, n - c0)
            K, Q, V, b = k[c0:c0 + r, h], q[c0:c0 + r, h], v[c0:c0 + r, j], beta[c0:c0 + r, j]
            G = np.cumsum(g[c0:c0 + r, j])
            D = np.exp(G[:, None] - G[None, :])
            T = np.linalg.inv(np.eye(r) - np.tril(-b[:, None] * D * (K @ K.T), -1))
            W, U0 = T @ (b[:, None] * np.exp(G)[:, None] * K), T @ (b[:, None] * V)
            P = np.tril(D * (Q @ K.T))
            u = U0 - rnd(W) @ rnd(S[j])
            out[c0:c0 + r, j] = np.exp(G)[:, None] * (rnd(Q) @ rnd(S[j])) + rnd(P) @ rnd(u)
            S[j] = np.exp(G[-1]) * S[j] + rnd(K).T @ rnd(np.exp(G[-1] - G)[:, None] * u)
    return out, S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, nargs=2, default=[16, 48], metavar=("HK", "HV"))
    parser.add_argument("--dims", type=int, nargs=2, default=[128, 128], metavar=("DK", "DV"))
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact", action="store_true", help="no rounding: checks the emulation")
    args = parser.parse_args()
    x = inputs(np.random.default_rng(args.seed), *args.heads, *args.dims, args.tokens)
    want_out, want_state = recurrent(*x)
    got_out, got_state = chunked(*x, rnd=(lambda a: a) if args.exact else tf32)
    scale = max(np.abs(want_out).max(), np.abs(want_state).max())
    print(f"heads {args.heads} dims {args.dims} tokens {args.tokens} seed {args.seed}: "
          f"out {np.abs(got_out - want_out).max() / scale:.3g}, "
          f"state {np.abs(got_state - want_state).max() / scale:.3g} of the scale {scale:.3g}")


if __name__ == "__main__":
    main()
