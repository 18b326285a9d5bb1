"""float64 numpy references of the vision tower's backend ops (layernorm, gelu, add_embedding_mix,
segment_attention, multi-stream rope), written from their definitions in backend.h, for the op tests on the CPU
backend (tests/test_backend_ops_vision.py) and the CUDA one (tests/gpu/test_cuda_vision.py)."""

from __future__ import annotations

import math

import numpy as np


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps) * w + b


def gelu(x: np.ndarray, kind: str) -> np.ndarray:
    x = x.astype(np.float64)
    if kind == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def embedding_mix(x: np.ndarray, table: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x [rows, cols] + sum over taps of weights[r, j] * table[ids[r, j]]."""
    return x.astype(np.float64) + np.einsum("rj,rjc->rc", weights.astype(np.float64), table.astype(np.float64)[ids])


def segment_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, segments: list[tuple[int, int]], heads: int,
                      head_dim: int, scale: float) -> np.ndarray:
    """out [rows, heads * head_dim] (NaN on rows outside every segment); q, k, v [rows, stride], head h at
    h * head_dim."""
    rows = q.shape[0]
    out = np.full((rows, heads * head_dim), np.nan)
    for row0, n in segments:
        for h in range(heads):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            qs, ks, vs = (a[row0:row0 + n, cols].astype(np.float64) for a in (q, k, v))
            s = qs @ ks.T * scale
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[row0:row0 + n, cols] = (p / p.sum(axis=1, keepdims=True)) @ vs
    return out


def bf16_round(x: np.ndarray) -> np.ndarray:
    """f32 values rounded to the nearest bf16 (ties to even), as f32; finite inputs."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def _first_order_error(w: np.ndarray, abs_v: np.ndarray, out: np.ndarray, value_rel: float,
                       score_err: np.ndarray) -> np.ndarray:
    """A bound on |out' - out| for out = w @ v (w the softmax weights, rows summing to 1) when each v_j (or
    each weight's numerator) is off by value_rel relative and each score s_j by at most score_err[:, j]: the
    weights become w_j f_j / sum(w f) with |f_j - 1| <= score_err_j to first order, so out' - out =
    sum_j w_j (f_j - F) (v_j - out) / F is at most sum_j w_j (err_j + mean err) (|v_j| + |out|); 10% on top for
    the second-order terms (scores are off by < 0.1 here)."""
    mean_err = (w * score_err).sum(axis=1, keepdims=True)
    abs_out = np.abs(out)
    score_part = (w * score_err) @ abs_v + mean_err * abs_out + mean_err * (w @ abs_v + abs_out)
    return value_rel * (w @ abs_v) + 1.1 * score_part


def segment_attention_bf16(q: np.ndarray, k: np.ndarray, v: np.ndarray, segments: list[tuple[int, int]],
                           heads: int, head_dim: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tensor-core segment attention's rounding model (cpp/backend/cuda/segment_attention.cu): q * scale *
    log2(e) (formed in f32), k and v rounded to bf16, S and the softmax in f32, P rounded to bf16 for P V over
    the f32 sum. Returns (rounded, near, far), NaN on rows outside every segment:
      rounded: the result with the inputs' bf16 rounding and everything else exact (float64);
      near: a bound on the kernel's distance from `rounded` (P's rounding, 2^-8 relative: bf16 keeps 8 significant bits, and f32 scores, taken
        as off by 2^-16 of sum_i |q_i k_i| scale: generous for sums of <= 128 products);
      far: a bound on its distance from the exact result (v's and P's rounding, 2^-7 together; scores off by
        2^-7 + 2^-16 of sum_i |q_i k_i| scale, from q's and k's rounding and the f32 sum)."""
    rows = q.shape[0]
    rounded, near, far = (np.full((rows, heads * head_dim), np.nan) for _ in range(3))
    q_scale = np.float32(np.float32(scale) * np.float32(math.log2(math.e)))
    qb = bf16_round(q.astype(np.float32) * q_scale).astype(np.float64) / math.log2(math.e)  # natural units
    kb, vb = (bf16_round(a).astype(np.float64) for a in (k, v))
    for row0, n in segments:
        for h in range(heads):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            seg = slice(row0, row0 + n)
            s = qb[seg, cols] @ kb[seg, cols].T
            p = np.exp(s - s.max(axis=1, keepdims=True))
            w = p / p.sum(axis=1, keepdims=True)
            out = w @ vb[seg, cols]
            rounded[seg, cols] = out
            abs_q, abs_k, abs_v = (np.abs(a[seg, cols].astype(np.float64)) for a in (q, k, v))
            abs_qk = abs_q @ abs_k.T * scale
            near[seg, cols] = _first_order_error(w, np.abs(vb[seg, cols]), out, 2**-8, 2**-16 * abs_qk)
            far[seg, cols] = _first_order_error(w, abs_v, out, 2**-7, (2**-7 + 2**-16) * abs_qk)
    return rounded, near, far


def rope_streams(x: np.ndarray, heads: int, head_stride: int, positions: np.ndarray, inv_freq: np.ndarray,
                 freq_stream: np.ndarray) -> np.ndarray:
    """Half (NeoX) pairing over the first 2 * len(inv_freq) values of each head; frequency i takes its angle from
    positions[r, freq_stream[i]] (positions [rows, streams]), formed in f32 as the backends form it."""
    out = x.astype(np.float64)
    half = len(inv_freq)
    angles = (positions[:, freq_stream].astype(np.float32) * inv_freq[None, :]).astype(np.float64)
    c, s = np.cos(angles), np.sin(angles)
    for h in range(heads):
        a = slice(h * head_stride, h * head_stride + half)
        b = slice(h * head_stride + half, h * head_stride + 2 * half)
        x1, x2 = out[:, a].copy(), out[:, b].copy()
        out[:, a], out[:, b] = x1 * c - x2 * s, x2 * c + x1 * s
    return out
