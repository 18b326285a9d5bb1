"""The chunked Gated DeltaNet prefill kernels (cpp/backend/cuda/gdn_prefill.cu) and the decode step against the
CPU backend's chunked form and against the GPU's token-by-token twin ("cuda-reference": the same backend with
set_reference_kernels), through the `_engine.cuda.Ops` harness of test_cuda_backend.py (outputs NaN-poisoned).

Bound: out and states within 2e-4 x the largest |value| of the reference (assert_gdn_rule_close): every path is
f32 with the same math in a different summation order (the chunked form also reassociates the recurrence through
the (I - A)^-1 solve); with unit keys and beta <= 1 that solve is well conditioned, so the differences stay at a
few f32 ulps of the scale, far below 2e-4, while any indexing or masking slip is O(1) of the scale.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_backend import assert_gdn_rule_close, gdn_rule_inputs

from ninfer import _engine

pytestmark = pytest.mark.gpu

LENGTHS = [1, 63, 64, 65, 200, 1000]  # around the chunk edges (64) and across many chunks
PREFILL_CASES = [  # (Hk, Hv, Dk, Dv, tokens per sequence)
    (16, 48, 128, 128, LENGTHS),  # Qwen3.5-27B's heads, several sequences of one call
    (2, 6, 24, 40, LENGTHS),      # odd head dims: Dv not a multiple of the 32-column slice
    (3, 3, 32, 72, [65, 1000, 2]),
    (1, 2, 256, 16, [130, 7]),    # the largest key head dim the chunked kernels take
    (1, 1, 8, 4, [64, 129]),
]


@pytest.fixture(scope="module")
def backends():
    """(cuda, cuda-reference, cpu)."""
    return _engine.cuda.Ops("cuda"), _engine.cuda.Ops("cuda-reference"), _engine.cuda.Ops("cpu")


def case_id(c) -> str:
    return f"hk{c[0]}-hv{c[1]}-dk{c[2]}-dv{c[3]}-{len(c[4])}seq"


@pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id)
def test_chunked_prefill_matches_cpu_and_slow_twin(backends, case):
    cuda, reference, cpu = backends
    hk, hv, dk, dv, ns = case
    q, k, v, g, beta, states = gdn_rule_inputs(hk, hv, dk, dv, ns)
    slots = list(range(len(ns)))[::-1]   # sequence i in slot n-1-i: a wrong state pointer shows
    fast, slow, host = (o.gdn_rule(q, k, v, g, beta, ns, slots, hk, hv, dk, dv, 64, states)
                        for o in (cuda, reference, cpu))
    assert_gdn_rule_close(fast, host, "chunked vs CPU chunked")
    assert_gdn_rule_close(fast, slow, "chunked vs GPU per-token")


@pytest.mark.parametrize("case", [(16, 48, 128, 128), (2, 6, 24, 40)],
                         ids=lambda c: f"hk{c[0]}-hv{c[1]}-dk{c[2]}-dv{c[3]}")
def test_chunked_prefill_in_several_calls(backends, case):
    """Two sequences prefilled in four calls each (the state carried in its slot between calls, as chunked
    prefill does) equal the CPU over all their tokens in one call."""
    cuda, _, cpu = backends
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
    assert_gdn_rule_close((got_out, carried), (want_out, want_states), "prefill in four calls")


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_decode_step_matches_slow_twin(backends, batch):
    """The decode kernel (warps split each column's Dk sum) against the per-token kernel at the 27B shape."""
    cuda, reference, _ = backends
    hk, hv, dk, dv = 16, 48, 128, 128
    ns = [1] * batch
    q, k, v, g, beta, states = gdn_rule_inputs(hk, hv, dk, dv, ns)
    slots = list(range(batch))
    fast, slow = (o.gdn_rule(q, k, v, g, beta, ns, slots, hk, hv, dk, dv, 64, states) for o in (cuda, reference))
    assert_gdn_rule_close(fast, slow, f"decode batch {batch}")
