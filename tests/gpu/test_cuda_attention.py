"""The fast CUDA attention paths (tensor-core flash prefill, split-KV decode) against the CPU backend.

Same harness as test_cuda_backend.py::test_kv_write_and_attention (Ops on "cuda" and "cpu", fresh random
inputs, outputs NaN-poisoned, pages a random permutation of the pool, q in the gated layout): every KV dtype
(nvfp4 and k8v4 included: each backend quantizes the rows itself with the same f32 operations, so both attend over
the same codes and the bounds below hold unchanged; their head dims must be multiples of 16),
several sequences per call with different starts (chunked prefill continuing a sequence, decode rows beside
prefill rows), odd lengths, head dims 16..256, GQA groups 1..12, and a head dim (40) only the slow twin takes.

Which path a sequence takes (cpp/backend/cuda/attention.cu): f32 KV or a head dim outside {16, 32, 64, 128,
256}: the slow twin; else at least PREFILL_MIN_ROWS new rows, or a GQA group above 8: the flash prefill
kernel; else split-KV decode.

Bounds. Let mag = sum_j p_j |v_j| / sum_j p_j (the softmax-weighted mean of |v|, per output element), got
exactly as the CPU attention of |v|.
  - slow twin and decode: f32 throughout, only the summation order differs: |err| <= 1e-4 mag + 1e-6.
  - flash prefill: the kernel rounds q * scale * log2(e) to bf16 and P to bf16. The reference is the CPU
    backend given that same rounded q (so the scores agree up to f32 order); P's rounding (unit roundoff 2^-9
    per weight) moves an output by at most 2^-9 mag. Bound: 2^-8 mag + 1e-6 (a factor 2 for the f32
    differences in scores and sums).
"""

from __future__ import annotations

import numpy as np
import pytest
import test_cuda_backend as backend_tests
import test_cuda_runtime as runtime_tests
from test_cuda_backend import assert_close, attention_inputs, run_attention

from ninfer.engine import Engine

ops = backend_tests.ops  # the (cuda, cpu) Ops fixture

pytestmark = pytest.mark.gpu

PREFILL_MIN_ROWS = 8            # kPrefillMinRows in attention.cu
DECODE_MAX_GROUP = 8            # kDecodeMaxGroup in flash_attention.h
FAST_HEAD_DIMS = (16, 32, 64, 128, 256)
LOG2E = np.float32(1.4426950408889634)

CASES = [  # (heads, kv_heads, head_dim, [(history, new rows) per sequence])
    (2, 1, 16, [(0, 9), (3, 1)]),                            # group 2, the smallest head dim
    (4, 4, 64, [(0, 64), (64, 65), (130, 1)]),                # group 1, page-aligned starts and lengths
    (12, 2, 256, [(0, 77), (100, 45), (2000, 1), (61, 3)]),   # group 6 (27B's): chunked prefill + decode
    (6, 1, 128, [(500, 200)]),                                # a prefill chunk continuing a long history
    (16, 2, 32, [(0, 11), (40, 1), (7, 7)]),                  # group 8, the tiny models' head dim
    (12, 1, 64, [(0, 20), (300, 1), (9, 2)]),                 # group 12: decode rows go to the prefill kernel
    (3, 3, 40, [(63, 2), (0, 17)]),                           # head dim 40: the slow twin for every dtype
    (24, 4, 256, [(3000, 1), (0, 1), (777, 1), (64, 1)]),     # 27B decode batch: many splits, some empty
]

# Split-KV decode at the split counts the engine uses (flash_decode_max_splits: about 4 blocks per
# multiprocessor over rows x KV heads, at most 128; the counts below are an H200's, 132 multiprocessors), at
# contexts (history + 1 for a decode row) of 1, 63, 64, 65 (either side of a page boundary), several thousand,
# and past 128 pages (two pages per split at 128 splits). 35B-A3B's attention shape: 16 heads, 2 KV heads, 256.
DECODE_CONTEXTS = (1, 63, 64, 65, 4000, 9000)
DECODE_CASES = [
    *[pytest.param((16, 2, 256, [(c - 1, 1)]), id=f"batch1-ctx{c}") for c in DECODE_CONTEXTS],  # 128 splits
    pytest.param((16, 2, 256, [(c - 1, 1) for c in (*DECODE_CONTEXTS, 130, 1000)]), id="batch8"),  # 33 splits
    # 70 rows x 8 KV heads: one split, so a split walks a row's every page; contexts 1..66 and thousands.
    pytest.param((16, 8, 128, [(h, 7) for h in (0, 57, 58, 59, 3000, 1, 100, 640, 63, 2000)]), id="one-split"),
    # 16 rows x 4 KV heads: 9 splits, several pages each at the long contexts.
    pytest.param((8, 4, 64, [(h, 2) for h in (0, 62, 63, 64, 5000, 700, 2, 1500)]), id="few-splits"),
]


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round f32 to the nearest bf16, ties to even (the kernels' __floats2bfloat162_rn)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def flash_prefill_sequences(spec, heads: int, kv_heads: int, d: int, kv_dtype: str) -> list[bool]:
    fast = kv_dtype != "f32" and d in FAST_HEAD_DIMS
    return [fast and (n >= PREFILL_MIN_ROWS or heads // kv_heads > DECODE_MAX_GROUP) for _, n in spec]


FP4_FORMATS = ("nvfp4", "k8v4")  # value rows of whole 16-value blocks


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8", "int8", "nvfp4", "k8v4", "f32"])
@pytest.mark.parametrize("case", [*(pytest.param(c, id=f"h{c[0]}-kv{c[1]}-d{c[2]}-{len(c[3])}seq") for c in CASES),
                                  *DECODE_CASES])
def test_fast_attention_matches_cpu(ops, kv_dtype, case):
    cuda, cpu = ops
    heads, kv_heads, d, spec = case
    if kv_dtype in FP4_FORMATS and d % 16:
        pytest.skip("nvfp4 rows are whole 16-value blocks (the pool refuses this head dim on every backend)")
    inputs = attention_inputs(heads, kv_heads, d, spec)
    got = run_attention(cuda, inputs, heads, kv_heads, d, kv_dtype)

    # The reference's q: the flash prefill rows' q rounded as the kernel rounds it (in the exp2 domain).
    q_scale = np.float32(d ** -0.5) * LOG2E
    q_ref = inputs["q"].copy()
    row_is_flash = np.zeros(q_ref.shape[0], dtype=bool)
    row0 = 0
    for (_, n), flash in zip(spec, flash_prefill_sequences(spec, heads, kv_heads, d, kv_dtype)):
        row_is_flash[row0:row0 + n] = flash
        row0 += n
    for h in range(heads):
        cols = slice(h * 2 * d, h * 2 * d + d)
        block = q_ref[row_is_flash, cols]
        q_ref[row_is_flash, cols] = (bf16_round(block * q_scale) / q_scale).astype(np.float32)
    reference = dict(inputs, q=q_ref)
    want = run_attention(cpu, reference, heads, kv_heads, d, kv_dtype)
    magnitudes = dict(reference, hv=np.abs(inputs["hv"]), nv=np.abs(inputs["nv"]))
    mag = run_attention(cpu, magnitudes, heads, kv_heads, d, kv_dtype)

    rel = np.where(row_is_flash[:, None], 2.0 ** -8, 1e-4)
    assert_close(got, want, 0.0, f"attention {kv_dtype} (flash prefill rows: {int(row_is_flash.sum())})",
                 atol=rel * mag + 1e-6)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8", "nvfp4", "k8v4"])
def test_fast_decode_graph_replay_equals_eager(tiny_artifacts, kv_dtype):
    """The engine on bf16 / fp8 KV (flash prefill for the prompts, split-KV decode for the steps): decode
    passes replayed as CUDA graphs (captured at one context, replayed at longer ones: the split count is fixed
    by the row count, splits past a row's pages stay empty), while the contexts grow past page boundaries, give
    the eager passes' logprobs bit for bit."""
    results = {}
    for graphs in (True, False):
        options = runtime_tests._options(kv_dtype=kv_dtype, cuda_graphs=graphs)
        with Engine.open_sync(tiny_artifacts["qwen3_5"], options) as engine:
            prompts = runtime_tests._prompts(engine.info.vocab_size, 3)
            results[graphs] = runtime_tests._run(engine, prompts, 48)
            assert (engine.memory_plan()["graph_replays"] >= 20) == graphs
    assert results[True] == results[False]
