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
