"""The chunked Gated DeltaNet prefill kernels (cpp/backend/cuda/gdn_prefill.cu) and the decode step against the
CPU backend's chunked form and against the GPU's twins, through the `_testing.cuda.Ops` harness of
test_cuda_backend.py (outputs NaN-poisoned): "cuda" (the chunked form with the tensor-core scan where the key head
dim allows it), "cuda-f32" (the same with the f32 scan) and "cuda-reference" (the token-by-token kernel).

Bounds, as a fraction of the largest |value| of the reference (assert_gdn_rule_close):
- f32 paths (the f32 chunked scan, the decode step, the per-token kernel, the CPU): 2e-4. The same math in a
  different summation order (the chunked form also reassociates the recurrence through the (I - A)^-1 solve);
  with unit keys and beta <= 1 that solve is well conditioned, so the differences stay at a few f32 ulps of the
  scale, far below 2e-4, while any indexing or masking slip is O(1) of the scale.
- the tensor-core scan: GDN_TF32_REL = 3e-3 (test_cuda_backend.gdn_rule_rel says when it applies). Its products
  W S, Q S, P u and K^T u take operands rounded to nearest tf32 (unit roundoff u = 2^-11), so each product term
  carries a relative error of at most 2u and a length-n dot product errs by at most 2u sum|a_i b_i|; the errors
  are zero-mean and independent, so they grow like sqrt(n), and the recurrence damps them (decay < 1, and the
  delta rule corrects the state along each new key). bench/gdn_tf32_rounding.py runs the chunked form with
  exactly these roundings (exact sums otherwise) against a float64 recurrence on these inputs: at the 27B shape
  over 1000 tokens at most 5.6e-4 of the scale on the state and 4.5e-5 on the outputs (2 seeds); (2, 6, 48, 40),
  (3, 3, 32, 72) and (1, 3, 16, 136) at most 4.2e-4. 3e-3 (6u) leaves ~5x; an indexing slip is O(1) of the scale.
  The prepare kernel's k.k and q.k products run as 3xTF32 (hi/lo splits), f32-accurate: no extra term.
"""

from __future__ import annotations

import numpy as np
import pytest
from ninfer import _testing
from test_cuda_backend import assert_gdn_rule_close, gdn_rule_inputs, gdn_rule_rel

pytestmark = pytest.mark.gpu

LENGTHS = [1, 63, 64, 65, 200, 1000]  # around the chunk edges (64) and across many chunks
PREFILL_CASES = [  # (Hk, Hv, Dk, Dv, tokens per sequence)
    (16, 48, 128, 128, LENGTHS),  # Qwen3.5-27B's heads, several sequences of one call
    (2, 6, 48, 40, LENGTHS),      # tensor-core scan: Dk a multiple of 16 but not of 32, Dv below one slice
    (3, 3, 32, 72, [65, 1000, 2]),  # tensor-core scan: Dv over one 64-column slice, not a multiple of 8
    (1, 3, 16, 136, [200, 64]),   # tensor-core scan: the smallest Dk (one m-tile), three slices
    (2, 6, 24, 40, LENGTHS),      # odd head dims the tensor-core scan does not take: the f32 scan
    (1, 2, 256, 16, [130, 7]),    # the largest key head dim the chunked kernels take (f32 scan)
    (1, 1, 8, 4, [64, 129]),
]


@pytest.fixture(scope="module")
def backends():
    """(cuda, cuda-f32, cuda-reference, cpu)."""
    return tuple(_testing.cuda.Ops(name) for name in ("cuda", "cuda-f32", "cuda-reference", "cpu"))


def case_id(c) -> str:
    return f"hk{c[0]}-hv{c[1]}-dk{c[2]}-dv{c[3]}-{len(c[4])}seq"


@pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id)
def test_chunked_prefill_matches_cpu_and_slow_twins(backends, case):
    cuda, f32, reference, cpu = backends
    hk, hv, dk, dv, ns = case
    q, k, v, g, beta, states = gdn_rule_inputs(hk, hv, dk, dv, ns)
    slots = list(range(len(ns)))[::-1]   # sequence i in slot n-1-i: a wrong state pointer shows
    fast, twin, slow, host = (o.gdn_rule(q, k, v, g, beta, ns, slots, hk, hv, dk, dv, 64, states)
                              for o in (cuda, f32, reference, cpu))
    assert_gdn_rule_close(twin, host, "f32 chunked vs CPU chunked")
    assert_gdn_rule_close(twin, slow, "f32 chunked vs GPU per-token")
    rel = gdn_rule_rel(dk, ns)
    assert_gdn_rule_close(fast, twin, "chunked vs f32 chunked twin", rel)
    assert_gdn_rule_close(fast, host, "chunked vs CPU chunked", rel)


@pytest.mark.parametrize("case", [(16, 48, 128, 128), (2, 6, 24, 40)],
                         ids=lambda c: f"hk{c[0]}-hv{c[1]}-dk{c[2]}-dv{c[3]}")
def test_chunked_prefill_in_several_calls(backends, case):
    """Two sequences prefilled in four calls each (the state carried in its slot between calls, as chunked
    prefill does) equal the CPU over all their tokens in one call."""
    cuda, _, _, cpu = backends
    hk, hv, dk, dv = case
    pieces = [(100, 1), (64, 65), (1, 300), (130, 2)]   # (tokens of sequence 0, tokens of sequence 1) per call
    totals = [sum(p[0] for p in pieces), sum(p[1] for p in pieces)]
    q, k, v, g, beta, states = gdn_rule_inputs(hk, hv, dk, dv, totals)
    slots = [0, 1]
    want_out, want_states = cpu.gdn_rule(q, k, v, g, beta, totals, slots, hk, hv, dk, dv, 64, states)

    # Rows of the one-call layout ([seq 0 rows | seq 1 rows]) that each call takes.
    starts, outs = [0, 0], []
    carried = states
    for n0, n1 in pieces:
        rows = np.r_[np.arange(starts[0], starts[0] + n0), totals[0] + np.arange(starts[1], starts[1] + n1)]
        take = [x[rows] for x in (q, k, v, g, beta)]
        out, carried = cuda.gdn_rule(*take, [n0, n1], slots, hk, hv, dk, dv, 64, carried)
        outs.append((rows, out))
        starts = [starts[0] + n0, starts[1] + n1]
    got_out = np.full_like(want_out, np.nan)
    for rows, out in outs:
        got_out[rows] = out
    assert_gdn_rule_close((got_out, carried), (want_out, want_states), "prefill in four calls",
                          gdn_rule_rel(dk, [2]))


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_decode_step_matches_slow_twin(backends, batch):
    """The decode kernel (warps split each column's Dk sum) against the per-token kernel at the 27B shape."""
    cuda, _, reference, _ = backends
    hk, hv, dk, dv = 16, 48, 128, 128
    ns = [1] * batch
    q, k, v, g, beta, states = gdn_rule_inputs(hk, hv, dk, dv, ns)
    slots = list(range(batch))
    fast, slow = (o.gdn_rule(q, k, v, g, beta, ns, slots, hk, hv, dk, dv, 64, states) for o in (cuda, reference))
    assert_gdn_rule_close(fast, slow, f"decode batch {batch}")
