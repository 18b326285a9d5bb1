"""The bounds of vision_op_refs.segment_attention_bf16, which tests/gpu/test_cuda_vision.py holds the tensor-core
segment attention to, hold for a numpy simulation of that kernel's rounding (bf16 q * scale * log2(e), k, v and P,
f32 scores and softmax sum), on fresh random inputs; and they are not vacuous: a result with one key too many per
segment breaks the near bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import vision_op_refs as ref

UNEVEN = [(0, 1), (1, 63), (64, 64), (128, 65), (193, 300)]


def simulate_kernel(q, k, v, segments, heads, head_dim, scale, extra_key=False):
    q_scale = np.float32(np.float32(scale) * np.float32(math.log2(math.e)))
    qb, kb, vb = ref.bf16_round(q * q_scale), ref.bf16_round(k), ref.bf16_round(v)
    out = np.full((q.shape[0], heads * head_dim), np.nan)
    for row0, n in segments:
        keys = slice(row0, row0 + n + int(extra_key))
        for h in range(heads):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            s = (qb[row0 : row0 + n, cols] @ kb[keys, cols].T).astype(np.float32)
            p = np.exp2(s - s.max(axis=1, keepdims=True)).astype(np.float32)
            out[row0 : row0 + n, cols] = (ref.bf16_round(p).astype(np.float64) @ vb[keys, cols]) / p.astype(
                np.float64
            ).sum(axis=1, keepdims=True)
    return out


@pytest.mark.parametrize(
    "heads,head_dim,segments,rows", [(4, 72, UNEVEN, 500), (2, 8, UNEVEN, 493), (2, 128, [(10, 97)], 120)]
)
def test_the_simulated_kernel_is_within_the_bounds(heads, head_dim, segments, rows):
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((rows, 3 * heads * head_dim)).astype(np.float32) * 2 for _ in range(3))
    scale = head_dim**-0.5
    exact = ref.segment_attention(q, k, v, segments, heads, head_dim, scale)
    rounded, near, far = ref.segment_attention_bf16(q, k, v, segments, heads, head_dim, scale)
    inside = ~np.isnan(exact).all(axis=1)
    sim = simulate_kernel(q, k, v, segments, heads, head_dim, scale)[inside]
    assert (np.abs(sim - rounded[inside]) <= near[inside]).all()
    assert (np.abs(sim - exact[inside]) <= far[inside]).all()
    wrong = simulate_kernel(q, k, v, segments, heads, head_dim, scale, extra_key=True)
    covered = ~np.isnan(wrong).all(axis=1)
    assert (np.abs(wrong[covered] - rounded[covered]) > near[covered]).any()
