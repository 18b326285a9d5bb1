"""The CUDA backend against the CPU backend, op by op and end to end.

Ops: `_testing.cuda.Ops("cuda")` and `Ops("cpu")` run the same binding code on each backend (inputs copied into
the backend's memory, outputs NaN-poisoned first), on fresh random inputs over several shapes, odd ones included.
f32 ops computed in a different order differ by rounding only: bounds are stated per op.

End to end: tiny random Qwen3.5 dense and MoE checkpoints (tests/tiny_models.py) converted to bf16 artifacts run
on backend="cuda" and backend="cpu" (f32 KV): prefill logits (every row) and 16 greedy decode steps agree within
LOGIT_TOL * max|logit|, and the greedy tokens are identical wherever the CPU's top two logits are further apart
than the logits may move (both backends are fed the CPU's tokens, so one near-tie does not end the comparison).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from artifact_files import encoded, write_artifact  # noqa: E402
from logit_tolerance import F32_TOL, INT16_TOL  # noqa: E402
from ninfer import _engine, _testing  # noqa: E402

pytestmark = pytest.mark.gpu

# f32 rounding through 8 layers: measured CPU-vs-HF parity is ~1e-5 of the scale. With cuBLASLt, prefill GEMMs
# (rows > 8, the lm_head over all_logits rows included) round their activations to bf16 (2^-9 relative): about
# 1e-3 relative noise per layer, a few 1e-3 of max|logit| after 8 layers and the lm_head; the bound leaves ~5x.
LOGIT_TOL = 1e-3  # the tiny models' GEMMs take the exact f32 twin (inner dimensions below the fast paths' minimum)
GREEDY_STEPS = 16


@pytest.fixture
def ops():
    """(cuda, cpu): fresh per test, so no weight cached by one test's host address is seen by another."""
    return _testing.cuda.Ops("cuda"), _testing.cuda.Ops("cpu")


def rng() -> np.random.Generator:
    return np.random.default_rng()


def f32(*shape) -> np.ndarray:
    return rng().standard_normal(shape).astype(np.float32)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str, atol: float = 0.0) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    assert np.isfinite(got).all(), f"{what}: {int((~np.isfinite(got)).sum())} unwritten or non-finite outputs"
    err = np.abs(got.astype(np.float64) - want)
    bound = rtol * np.abs(want).astype(np.float64) + atol
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{what}: {int((err > bound).sum())} values off, worst at {worst}: "
                                  f"{got[worst]} vs {want[worst]} (bound {bound[worst]:.3g})")


# ---------- matrices ----------

LINEAR_CASES = [("f32", None, 7, 37), ("bf16", None, 70, 1024), ("f16", None, 13, 515), ("fp8_e4m3", None, 65, 2048),
                ("fp8_e4m3", None, 64, 2048), ("int8", 32, 11, 544), ("int4", 64, 67, 1088), ("int4", 128, 129, 4096),
                ("nvfp4", None, 71, 2048)]


def linear_tolerance(enc: str, out: int, cols: int, rows: int) -> float:
    """Bound on max |cuda - cpu| / max |y| for `linear`. The decode GEMV (rows <= 8) and the f32 twin differ from
    the CPU by summation order only. The prefill GEMM's fast paths (tests/gpu/test_cuda_gemm.py has their exact
    bounds) round operands: bf16 x and dequantized weights (unit roundoff 2^-9 each), or, W8A8 for fp8 weights
    with out and cols multiples of 16, x to e4m3 per row (2^-4). The error of one output is then a sum of cols
    independent roundings, about u / sqrt(3) times the root sum of squares of the products, while max |y| is
    several times that sum: one unit roundoff times 2 (bf16, two operands) leaves > 9 sigma, 2^-3 for fp8 > 9."""
    if rows <= 8 or not _testing.cuda.cublaslt or enc in ("f32", "f16") or cols % 8:
        return 2e-5 * np.sqrt(cols)
    if enc == "fp8_e4m3" and cols % 16 == 0 and out % 16 == 0:
        return 2.0**-3
    return 2.0**-7


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    r = rng()
    tensors = {f"{e}-{o}x{c}": encoded(r.standard_normal((o, c)).astype(np.float32), e, g) for e, g, o, c in LINEAR_CASES}
    # Stacked experts [E, I, H] / [E, H, I] (MOE_SHAPES).
    for name, (enc, group, hidden, inter) in MOE_SHAPES.items():
        tensors[f"experts_gate-{name}"] = encoded(r.standard_normal((6, inter, hidden)).astype(np.float32), enc, group)
        tensors[f"experts_up-{name}"] = encoded(r.standard_normal((6, inter, hidden)).astype(np.float32), enc, group)
        tensors[f"experts_down-{name}"] = encoded(r.standard_normal((6, hidden, inter)).astype(np.float32), enc, group)
    for e, g, o, c in SHARED_INPUT_CASES + SHARED_SPLIT_CASES + SHARED_MOE_CASES:
        tensors[f"shared/{e}-{o}x{c}"] = encoded(r.standard_normal((o, c)).astype(np.float32), e, g)
    path = write_artifact(tmp_path_factory.mktemp("cuda-backend") / "w.ninfer", tensors)
    art = _engine.Artifact.open(path)
    yield art
    art.close()


# name: (encoding, group size, hidden, expert width); bf16-odd's odd widths take the simple kernels.
MOE_SHAPES = {"bf16": ("bf16", None, 64, 96), "int4": ("int4", 32, 64, 96), "bf16-odd": ("bf16", None, 37, 45)}

# Projections of one input: two int4 weights (one launch), nvfp4 (same activation split, another launch), fp8 and
# bf16 (their own splits), int8 g32 (the CUDA-core GEMV).
SHARED_INPUT_CASES = [("int4", 128, 33, 1024), ("int4", 128, 17, 1024), ("nvfp4", None, 9, 1024),
                      ("fp8_e4m3", None, 24, 1024), ("bf16", None, 5, 1024), ("int8", 32, 11, 1024)]
# Long rows and few m-tiles: the decode GEMV splits each weight's columns over blocks (split-K), so one launch holds
# several weights' partial sums and arrival counters side by side; five int4 weights take two launches (at most 4
# weights each) that reuse the counters the first one reset; two bf16 weights split further.
SHARED_SPLIT_CASES = [("int4", 128, 33, 8192), ("int4", 128, 17, 8192), ("int4", 128, 1, 8192),
                      ("int4", 128, 48, 8192), ("int4", 128, 9, 8192), ("bf16", None, 21, 8192),
                      ("bf16", None, 16, 8192)]
# The 35B-A3B MoE layer's projections of x, in the model's order: the router and the shared expert's gate (bf16: one
# launch, split in registers), then the shared expert's gate/up (int4: one split, one launch).
SHARED_MOE_CASES = [("bf16", None, 256, 2048), ("bf16", None, 1, 2048), ("int4", 128, 512, 2048),
                    ("int4", 128, 496, 2048)]


@pytest.mark.parametrize("cases,row_counts", [(SHARED_INPUT_CASES, (1, 3, 8, 12, 130)),
                                              (SHARED_SPLIT_CASES, (1, 4, 5, 8)),
                                              (SHARED_MOE_CASES, (1, 2, 8, 9))], ids=["mixed", "split-k", "moe"])
def test_linear_shared_input_equals_separate_linears(ops, weights, cases, row_counts):
    """One call for several weights gives each weight's linear() exactly: fused decode launches change no sum's
    order, and the prefill GEMM (rows > 8) converts x once per form (bf16; e4m3 with row scales) for all weights
    that take it, switching form between the weights of this list more than once."""
    cuda, cpu = ops
    for rows in row_counts:
        x = f32(rows, cases[0][3])
        names = [f"shared/{e}-{o}x{c}" for e, _, o, c in cases]
        together = cuda.linear_shared_input(x, weights, names)
        for (enc, _, out, cols), name, got in zip(cases, names, together, strict=True):
            np.testing.assert_array_equal(got, cuda.linear(x, weights, name, None), err_msg=f"{name} rows={rows}")
            if rows > 8:
                continue  # the prefill GEMM: its own bounds are tested in test_cuda_gemm.py
            want = cpu.linear(x, weights, name, None)
            tol = linear_tolerance(enc, out, cols, rows)
            assert_close(got, want, 0, f"{name} rows={rows}", atol=tol * np.abs(want).max())


@pytest.mark.parametrize("case", LINEAR_CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}")
def test_linear_every_row_count(ops, weights, case):
    """rows <= 8 take the decode GEMV, more the prefill GEMM; with and without bias."""
    cuda, cpu = ops
    enc, _, out, cols = case
    name = f"{enc}-{out}x{cols}"
    for rows in (1, 5, 8, 9, 33, 130):
        x = f32(rows, cols)
        bias = f32(out) if rows % 2 else None
        got, want = cuda.linear(x, weights, name, bias), cpu.linear(x, weights, name, bias)
        scale = np.abs(want).max() + 1e-30
        assert_close(got, want, 0, f"linear {name} rows={rows}", atol=linear_tolerance(enc, out, cols, rows) * scale)


def test_embed_every_encoding(ops, weights):
    cuda, cpu = ops
    for enc, _, out, cols in LINEAR_CASES:
        tokens = rng().integers(0, out, 19).astype(np.int32)
        name = f"{enc}-{out}x{cols}"
        np.testing.assert_array_equal(cuda.embed(tokens, weights, name), cpu.embed(tokens, weights, name),
                                      err_msg=f"embed {name}: dequantization differs")


# ---------- elementwise ----------

@pytest.mark.parametrize("n", [1, 257, 100_003, 4, 65_536])  # multiples of 4 take the float4 kernels
def test_elementwise(ops, n):
    cuda, cpu = ops
    a, b = f32(n), f32(n)
    assert_close(cuda.add(a, b), cpu.add(a, b), 0, "add")
    assert_close(cuda.swiglu(a, b), cpu.swiglu(a, b), 1e-6, "swiglu", atol=1e-7)


@pytest.mark.parametrize("rows,dim", [(1, 7), (5, 64), (33, 129)])
def test_row_ops(ops, rows, dim):
    cuda, cpu = ops
    x, wide = f32(rows, dim), f32(rows, dim + 5)
    assert_close(cuda.copy_columns(wide, rows, dim + 5, dim), cpu.copy_columns(wide, rows, dim + 5, dim), 0,
                 "copy_columns")
    idx = rng().integers(0, rows, 2 * rows + 1).astype(np.int64)
    assert_close(cuda.gather_rows(x, dim, idx), cpu.gather_rows(x, dim, idx), 0, "gather_rows")
    heads, hd = 3, dim
    xs, gate = f32(rows, heads * hd), f32(rows, heads * 2 * hd + 1)   # gate heads interleaved, odd row stride
    assert_close(cuda.sigmoid_gate(xs, rows, heads, hd, gate[:, hd:].copy(), heads * 2 * hd + 1 - hd, 2 * hd),
                 cpu.sigmoid_gate(xs, rows, heads, hd, gate[:, hd:].copy(), heads * 2 * hd + 1 - hd, 2 * hd),
                 1e-6, "sigmoid_gate", atol=1e-7)


# ---------- norms ----------

@pytest.mark.parametrize("rows,dim", [(1, 8), (7, 255), (70, 1024)])
@pytest.mark.parametrize("offset", [False, True], ids=["plain", "offset"])
def test_rmsnorm(ops, rows, dim, offset):
    cuda, cpu = ops
    x, w = f32(rows, dim + 3), f32(dim)   # strided input and output
    got = cuda.rmsnorm(x, rows, dim, dim + 3, w, offset, 1e-6, dim + 2)
    want = cpu.rmsnorm(x, rows, dim, dim + 3, w, offset, 1e-6, dim + 2)
    assert_close(got[:, :dim], want[:, :dim], 1e-5, f"rmsnorm {rows}x{dim}", atol=1e-6)
    assert np.isnan(got[:, dim:]).all(), "rmsnorm wrote past dim in the output stride"


@pytest.mark.parametrize("rows,dim", [(1, 8), (7, 255), (70, 1024), (3, 5120), (2, 2050)])
@pytest.mark.parametrize("offset", [False, True], ids=["plain", "offset"])
def test_add_rmsnorm(ops, rows, dim, offset):
    """The fused residual add + norm (float4 rows when dim % 4 == 0, else scalar) against the CPU twin, and against
    the separate add and rmsnorm ops."""
    cuda, cpu = ops
    hidden, delta, w = f32(rows, dim), f32(rows, dim), f32(dim)
    got_sum, got = cuda.add_rmsnorm(hidden, delta, rows, dim, w, offset, 1e-6)
    want_sum, want = cpu.add_rmsnorm(hidden, delta, rows, dim, w, offset, 1e-6)
    assert_close(got_sum, want_sum, 0, f"add_rmsnorm sum {rows}x{dim}")
    assert_close(got, want, 1e-5, f"add_rmsnorm {rows}x{dim}", atol=1e-6)
    separate = cuda.rmsnorm(cuda.add(hidden, delta).reshape(rows, dim), rows, dim, dim, w, offset, 1e-6, dim)
    assert_close(got, separate, 1e-5, f"add_rmsnorm vs add + rmsnorm {rows}x{dim}", atol=1e-6)


@pytest.mark.parametrize("rows,heads,dim", [(1, 2, 16), (9, 3, 96), (40, 4, 128), (5, 3, 30), (3, 2, 260)])
def test_gdn_norms_and_gates(ops, rows, heads, dim):
    cuda, cpu = ops
    x, z, w = f32(rows, heads * dim), f32(rows, heads * dim), f32(dim)
    assert_close(cuda.gated_rmsnorm(x, z, rows, heads, dim, w, 1e-6), cpu.gated_rmsnorm(x, z, rows, heads, dim, w, 1e-6),
                 1e-5, "gated_rmsnorm", atol=1e-6)
    stride = heads * dim + 5
    xs = f32(rows, stride)
    assert_close(cuda.l2norm_heads(xs, rows, heads, dim, stride, 0.3), cpu.l2norm_heads(xs, rows, heads, dim, stride, 0.3),
                 1e-5, "l2norm_heads", atol=1e-7)
    a, b, A_log, dt_bias = f32(rows, heads) * 8, f32(rows, heads), f32(heads), f32(heads)
    for got, want, what in zip(cuda.gdn_gates(a, b, rows, heads, A_log, dt_bias),
                               cpu.gdn_gates(a, b, rows, heads, A_log, dt_bias), ("g", "beta")):
        assert_close(got, want, 1e-5, f"gdn_gates {what}", atol=1e-7)


# ---------- rotary, KV pages, attention ----------

@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("rows,heads,head_dim,rotary", [(1, 2, 64, 64), (13, 3, 256, 64), (5, 1, 10, 6)])
def test_rope(ops, interleaved, rows, heads, head_dim, rotary):
    cuda, cpu = ops
    stride = heads * head_dim + 3
    x = f32(rows, stride)
    positions = rng().integers(0, 40_000, rows).astype(np.int64)
    inv_freq = (1.0 / 10_000 ** (np.arange(0, rotary, 2) / rotary)).astype(np.float32)
    assert_close(cuda.rope(x, rows, heads, head_dim, stride, positions, inv_freq, interleaved),
                 cpu.rope(x, rows, heads, head_dim, stride, positions, inv_freq, interleaved), 1e-5, "rope", atol=1e-5)


ATTENTION_CASES = [  # (heads, kv_heads, head_dim, [(history, new) per sequence])
    (2, 1, 16, [(0, 1)]),
    (4, 2, 64, [(0, 13), (70, 1), (5, 3)]),
    (8, 2, 256, [(130, 1), (0, 129)]),
    (3, 3, 40, [(63, 2), (64, 1), (200, 7)]),
]


def attention_inputs(heads: int, kv_heads: int, d: int, spec: list[tuple[int, int]]) -> dict:
    """Random inputs of Ops.attention for sequences [(history, new rows)]: each sequence's pages are taken
    from a random permutation of the pool, so a wrong page or offset shows; q is gated-layout strided
    ([q | gate] per head, as Qwen3.5's gated q_proj lays it out)."""
    width = kv_heads * d
    pages_needed = [(h + n + 63) // 64 for h, n in spec]
    order = rng().permutation(sum(pages_needed) + 3).astype(np.int32).tolist()
    seqs, at = [], 0
    for (h, n), p in zip(spec, pages_needed):
        seqs.append((h, n, order[at:at + p]))
        at += p
    hist_rows, rows = sum(h for h, _ in spec), sum(n for _, n in spec)
    return {"q": f32(rows, heads * 2 * d), "hk": f32(hist_rows, width), "hv": f32(hist_rows, width),
            "nk": f32(rows, width), "nv": f32(rows, width), "seqs": seqs, "pool_pages": len(order)}


def run_attention(backend, inputs: dict, heads: int, kv_heads: int, d: int, kv_dtype: str) -> np.ndarray:
    """kv_write of every sequence's history and new rows into a fresh pool (layer 1 of 2), then attention."""
    i = inputs
    return backend.attention(i["q"], heads * 2 * d, 2 * d, i["hk"], i["hv"], i["nk"], i["nv"], i["seqs"],
                             heads, kv_heads, d, d ** -0.5, kv_dtype, i["pool_pages"], 2, 1)


@pytest.mark.parametrize("kv_dtype", ["f32"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: f"h{c[0]}-kv{c[1]}-d{c[2]}-{len(c[3])}seq")
def test_kv_write_and_attention(ops, kv_dtype, case):
    """The slow twin (f32 KV: f32 throughout, so only the summation order differs); the fast paths taken by
    the other KV dtypes are tested against the CPU backend in test_cuda_attention.py."""
    cuda, cpu = ops
    heads, kv_heads, d, spec = case
    inputs = attention_inputs(heads, kv_heads, d, spec)
    assert_close(run_attention(cuda, inputs, heads, kv_heads, d, kv_dtype),
                 run_attention(cpu, inputs, heads, kv_heads, d, kv_dtype), 1e-4, f"attention {kv_dtype}",
                 atol=1e-5)


# ---------- greedy drafts ----------

# 248,320: the Qwen3.5 vocabulary (the MTP head's draft logits); 5: fewer columns than the block's threads.
@pytest.mark.parametrize("rows,cols", [(1, 248320), (3, 5), (4, 1000)])
def test_argmax_rows(ops, rows, cols):
    cuda, cpu = ops
    x = f32(rows, cols)
    x[0, cols // 2] = x[0, cols - 1] = x[0].max() + 1  # a tie: the lower column wins
    if rows > 1:
        x[1] = -np.inf  # nothing finite: column 0, as std::max_element gives
    want = np.argmax(x, axis=1).reshape(rows, 1)
    np.testing.assert_array_equal(cpu.argmax_rows(x, rows, cols), want)
    np.testing.assert_array_equal(cuda.argmax_rows(x, rows, cols), want)


# ---------- mixture of experts ----------

# 256 and 512 experts: the warp kernel's widest shapes (35B-A3B has 256); 600 takes the thread kernel.
@pytest.mark.parametrize("rows,experts,top_k", [(1, 8, 2), (37, 64, 8), (300, 128, 8), (1, 256, 8), (9, 256, 8),
                                                (5, 512, 10), (3, 600, 8), (2, 40, 40)])
def test_moe_route(ops, rows, experts, top_k):
    cuda, cpu = ops
    logits = f32(rows, experts) * 3
    logits[0, 1] = logits[0, 0]  # a tie: the lower expert id ranks first
    (gi, gw), (ci, cw) = cuda.moe_route(logits, rows, experts, top_k), cpu.moe_route(logits, rows, experts, top_k)
    np.testing.assert_array_equal(gi, ci, err_msg="moe_route: different experts chosen")
    assert_close(gw, cw, 1e-5, "moe_route weights", atol=1e-7)


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "with-shared"])
@pytest.mark.parametrize("enc", list(MOE_SHAPES))
@pytest.mark.parametrize("rows", [1, 3, 21])
def test_moe_experts(ops, weights, enc, rows, shared):
    """The routed experts' weighted sum, and with the gated shared expert added in the same pass (the MoE block's
    output: sum_j w_j y_j + sigmoid(logit) * shared), against the CPU twin. The shared term is scaled to the
    routed sum's size, so dropping it, or gating it wrongly, moves the output far past the bound."""
    cuda, cpu = ops
    top_k, experts, hidden = 3, 6, MOE_SHAPES[enc][2]
    x = f32(rows, hidden)
    ids = np.stack([rng().choice(experts, top_k, replace=False) for _ in range(rows)]).astype(np.int32)
    w = rng().random((rows, top_k)).astype(np.float32)
    names = (f"experts_gate-{enc}", f"experts_up-{enc}", f"experts_down-{enc}")
    term = {}
    if shared:
        routed = cpu.moe_experts(x, rows, hidden, ids, w, top_k, weights, *names)
        term = {"shared_out": f32(rows, hidden) * np.float32(np.abs(routed).max()), "shared_logit": f32(rows) * 3}
    got = cuda.moe_experts(x, rows, hidden, ids, w, top_k, weights, *names, **term)
    want = cpu.moe_experts(x, rows, hidden, ids, w, top_k, weights, *names, **term)
    # The CPU twin's int4 experts round their inputs to int16 where the build has that path (tests/logit_tolerance.py:
    # ~1e-4 of the largest output after gate/up and down, which failed the f32 bound by 13 % on the H200, session 12).
    rel = INT16_TOL if any(_testing.kernels.int16_activations(weights, n) for n in names) else F32_TOL
    assert_close(got, want, 0, f"moe_experts {enc}", atol=rel * np.abs(want).max())


# ---------- Gated DeltaNet ----------

# The CUDA conv splits each sequence into tiles of 32 rows: sequences of one tile, several, and a partial last one,
# sequences shorter than the kernel's history or empty, and kernel widths 2 .. 8.
GDN_CONV_CASES = [(7, 4, [1]), (96, 4, [5, 1, 2]), (1000, 3, [70, 1]), (33, 2, [1, 1]), (300, 4, [100, 3, 1, 64, 32]),
                  (130, 8, [2, 6, 7, 40]), (17, 2, [3, 33]), (129, 5, [1, 2, 3, 4, 97]), (64, 6, [31, 32, 33]),
                  (40, 7, [0, 5, 70])]


@pytest.mark.parametrize("channels,kernel,ns", GDN_CONV_CASES)
def test_gdn_conv(ops, channels, kernel, ns):
    cuda, cpu = ops
    slots = list(range(len(ns)))[::-1]   # sequence i uses slot n-1-i
    mixed, w = f32(sum(ns), channels), f32(channels, kernel)
    states = f32(len(ns), channels * (kernel - 1))
    (go, gs), (co, cs) = (o.gdn_conv(mixed, ns, slots, channels, w, kernel, states) for o in (cuda, cpu))
    assert_close(go, co, 1e-5, "gdn_conv out", atol=1e-6)
    assert_close(gs, cs, 0, "gdn_conv history")


GDN_CONV_QKV_CASES = [  # (Hk, Hv, Dk, Dv, kernel, tokens per sequence)
    (2, 4, 128, 128, 4, [100, 1, 33]),   # the 27B head shape: one key head per 128-thread block
    (1, 2, 16, 48, 4, [5, 1]),           # a head narrower than a warp
    (2, 3, 40, 24, 3, [70, 2]),          # Dk not a multiple of 32; the last value group is partial (72 = 40 + 32)
    (1, 1, 256, 64, 4, [40]),            # the widest head the fused kernel takes
    (1, 1, 300, 16, 4, [3, 2]),          # wider: the unfused twin
    (2, 4, 64, 64, 4, [1, 1, 1]),        # a decode batch
]


@pytest.mark.parametrize("case", GDN_CONV_QKV_CASES, ids=str)
def test_gdn_conv_qkv(case):
    """The fused conv + per-head L2 norms + split against the CPU (gdn_conv, l2norm_heads, copy_columns) and
    against the CUDA twin that runs those three ops."""
    hk, hv, dk, dv, kernel, ns = case
    channels = 2 * hk * dk + hv * dv
    slots = list(range(len(ns)))[::-1]
    mixed, w = f32(sum(ns), channels), f32(channels, kernel)
    states = f32(len(ns), channels * (kernel - 1))
    q_scale = dk ** -0.5
    want = _testing.cuda.Ops("cpu").gdn_conv_qkv(mixed, ns, slots, hk, hv, dk, dv, w, kernel, q_scale, states)
    for backend in ("cuda", "cuda-reference"):
        got = _testing.cuda.Ops(backend).gdn_conv_qkv(mixed, ns, slots, hk, hv, dk, dv, w, kernel, q_scale, states)
        for g, c, what in zip(got[:3], want[:3], "qkv"):
            assert_close(g, c, 1e-5, f"{backend} gdn_conv_qkv {what}", atol=1e-6)
        assert_close(got[3], want[3], 0, f"{backend} gdn_conv_qkv history")


@pytest.mark.parametrize("channels,kernel,first,second", [(96, 4, [40, 2, 1], [1, 70, 3]), (50, 8, [3, 33], [65, 2])])
def test_gdn_conv_chunk_continuation(ops, channels, kernel, first, second):
    """A prefill split into two calls (the second starting from the history the first left) gives the same rows
    and history as the CPU conv over each whole sequence at once."""
    cuda, cpu = ops
    slots = list(range(len(first)))
    w = f32(channels, kernel)
    states = f32(len(first), channels * (kernel - 1))
    whole = [f32(a + b, channels) for a, b in zip(first, second)]
    part1 = np.concatenate([m[:a] for m, a in zip(whole, first)])
    part2 = np.concatenate([m[a:] for m, a in zip(whole, first)])
    out1, mid = cuda.gdn_conv(part1, first, slots, channels, w, kernel, states)
    out2, end = cuda.gdn_conv(part2, second, slots, channels, w, kernel, mid)
    want_out, want_end = cpu.gdn_conv(np.concatenate(whole), [a + b for a, b in zip(first, second)], slots, channels,
                                      w, kernel, states)
    rows1 = np.cumsum([0] + first)
    rows2 = np.cumsum([0] + second)
    got = np.concatenate([np.concatenate([out1[rows1[i]:rows1[i + 1]], out2[rows2[i]:rows2[i + 1]]])
                          for i in range(len(first))])
    assert_close(got, want_out, 1e-5, "gdn_conv out over two calls", atol=1e-6)
    assert_close(end, want_end, 0, "gdn_conv history after two calls")


GDN_CASES = [  # (Hk, Hv, Dk, Dv, tokens per sequence, chunk)
    (1, 1, 16, 16, [1], 64),
    (2, 4, 32, 48, [1, 1, 1], 64),       # a decode batch: the gdn_decode kernel
    (2, 4, 32, 48, [9, 1, 70], 16),      # mixed: the chunked kernels against the CPU chunked form
    (16, 48, 128, 128, [1, 1], 64),      # Qwen3.5-27B's head shape
    (2, 2, 24, 40, [130], 64),           # a key head dim the decode kernel has no build for
    (1, 2, 20, 8, [70, 3], 64),          # one the chunked kernels do not take (not a multiple of 8): per-token
]


def gdn_rule_inputs(hk: int, hv: int, dk: int, dv: int, ns: list[int]) -> tuple[np.ndarray, ...]:
    """Fresh random (q, k, v, g, beta, states) for the delta rule over sequences of ns new tokens: q, k
    L2-normalised per head (q also scaled by dk^-0.5) as the model feeds them, g = -0.3 |N(0, 1)|, a nonzero
    starting state per sequence."""
    rows = sum(ns)

    def l2(x):
        return (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)

    q = (l2(f32(rows, hk, dk)) * dk ** -0.5).reshape(rows, -1)
    k = l2(f32(rows, hk, dk)).reshape(rows, -1)
    v, g = f32(rows, hv * dv), (-np.abs(f32(rows, hv)) * 0.3).astype(np.float32)
    beta = rng().random((rows, hv)).astype(np.float32)
    states = (f32(len(ns), hv * dk * dv) * 0.1).astype(np.float32)
    return q, k, v, g, beta, states


# The tensor-core scan of the chunked delta rule rounds its product operands to tf32: its bound, derived and
# measured in tests/gpu/test_cuda_gdn.py's docstring.
GDN_TF32_REL = 3e-3


def gdn_rule_rel(dk: int, ns: list[int]) -> float:
    """The bound for CudaBackend::gdn_rule against an f32 path: the chunked form's tensor-core scan runs when some
    sequence has several tokens and the key head dim is one it takes (gdn_scan_mma_supported) and at least 64
    (smaller ones take the f32 scan), else f32 only."""
    tensor_cores = any(n > 1 for n in ns) and dk % 16 == 0 and 64 <= dk <= 128
    return GDN_TF32_REL if tensor_cores else 2e-4


def assert_gdn_rule_close(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray], what: str,
                          rel: float = 2e-4) -> None:
    """(out, states) of two gdn_rule runs agree within rel * the largest magnitude of either (f32 sums in
    different orders: the chunked form, the recurrence and the decode kernel all differ by rounding only)."""
    (go, gs), (co, cs) = got, want
    scale = max(np.abs(co).max(), np.abs(cs).max())
    assert_close(go, co, 0, f"{what} out", atol=rel * scale)
    assert_close(gs, cs, 0, f"{what} state", atol=rel * scale)


@pytest.mark.parametrize("case", GDN_CASES, ids=lambda c: f"hk{c[0]}-hv{c[1]}-dk{c[2]}-dv{c[3]}-{c[4]}")
def test_gdn_rule(ops, case):
    cuda, cpu = ops
    hk, hv, dk, dv, ns, chunk = case
    q, k, v, g, beta, states = gdn_rule_inputs(hk, hv, dk, dv, ns)
    slots = list(range(len(ns)))[::-1]
    got, want = (o.gdn_rule(q, k, v, g, beta, ns, slots, hk, hv, dk, dv, chunk, states) for o in (cuda, cpu))
    assert_gdn_rule_close(got, want, "gdn_rule", gdn_rule_rel(dk, ns))


# ---------- end to end ----------

def close_logits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = float(np.abs(want).max())
    assert np.isfinite(got).all(), f"{what}: non-finite logits"
    err = float(np.abs(got - want).max())
    assert err <= LOGIT_TOL * scale, f"{what}: max |Δlogit| {err:.3g} > {LOGIT_TOL} * scale {scale:.3g}"


def same_greedy_token(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The argmax of one row of logits agrees unless the CPU's top two are within what the logits may move."""
    top2 = np.sort(want)[-2:]
    margin = float(top2[1] - top2[0])
    if margin > 2 * LOGIT_TOL * float(np.abs(want).max()):
        assert int(got.argmax()) == int(want.argmax()), f"{what}: greedy token {got.argmax()} vs {want.argmax()}"


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe"])
def test_model_cuda_matches_cpu(tiny_artifacts, kind):
    models = {b: _testing.Model.open(str(tiny_artifacts[kind]), max_context=512, kv_dtype="f32", threads=4,
                                    max_sequences=3, backend=b) for b in ("cuda", "cpu")}
    vocab = models["cpu"].config["vocab_size"]
    prompt = np.random.default_rng(1).integers(0, vocab, 77).astype(np.int32)   # > one page, > one GDN chunk
    seqs = {b: m.new_sequence() for b, m in models.items()}
    got = models["cuda"].prefill(seqs["cuda"], prompt, all_logits=True)
    want = models["cpu"].prefill(seqs["cpu"], prompt, all_logits=True)
    close_logits(got, want, f"{kind} prefill")
    close_logits(models["cuda"].hidden, models["cpu"].hidden, f"{kind} final hidden")
    same_greedy_token(got[-1], want[-1], f"{kind} prefill")
    nxt = int(want[-1].argmax())
    for step in range(GREEDY_STEPS):
        logits = {b: m.decode(seqs[b], nxt) for b, m in models.items()}
        close_logits(logits["cuda"], logits["cpu"], f"{kind} decode step {step}")
        same_greedy_token(logits["cuda"][-1], logits["cpu"][-1], f"{kind} decode step {step}")
        nxt = int(logits["cpu"][-1].argmax())

    # A batched pass (a prefill next to two decodes) on CUDA equals the CPU one.
    fresh = {b: m.new_sequence() for b, m in models.items()}
    batch = {b: models[b].forward_batch([(seqs[b], np.array([5], np.int32)), (fresh[b], prompt[:9])], all_logits=True)
             for b in models}
    for i in range(2):
        close_logits(batch["cuda"][i], batch["cpu"][i], f"{kind} batched item {i}")

    # The MoE kind's MTP logits come out NaN on the CPU backend too (reported to the model owner): dense only.
    if models["cpu"].has_mtp and kind == "qwen3_5":
        hidden = models["cpu"].hidden[:8].copy()
        mtp = {b: models[b].mtp_logits(fresh[b], hidden, prompt[1:9], 0) for b in models}
        close_logits(mtp["cuda"], mtp["cpu"], f"{kind} MTP logits")
