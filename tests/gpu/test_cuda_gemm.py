"""The prefill GEMM (`_engine.cuda.gemm`, rows above the decode GEMV's 8) for every weight encoding and each of its
implementations, on fresh random inputs, outputs NaN-poisoned by the binding first:

- twin (f32 CUDA-core GEMM) against a float64 reference: f32 rounding only;
- bf16 (weights dequantized to bf16, activations rounded to bf16, cuBLASLt with f32 accumulation), streamed (int4 /
  int8 codes through the tensor cores, activations rounded to bf16, weights exact) and fp8 (W8A8:
  activations quantized to e4m3 per row with scale amax/448, cuBLASLt e4m3, per-row scales applied after) against
  (a) float64 products of the operands rounded exactly as documented (emulated here bit for bit), within the f32
  accumulation bound, and (b) the exact float64 reference and the twin, within the operand-rounding bound.

Bounds are worst-case per output, in terms of S = sum_i |x_i| |w_i| (rigorous: every product's relative error is
at most (1 + u_x)(1 + u_w) - 1 for unit roundoffs u of the operand formats).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from artifact_files import weight_pairs_artifact
from ninfer import _engine
from ninfer.artifact.encodings import bf16_bits_to_f32, e4m3_to_f32, f32_to_bf16_bits, f32_to_e4m3

pytestmark = pytest.mark.gpu

ROWS = (9, 17, 64, 129, 1000)
U_BF16 = 2.0**-8   # unit roundoff of bf16: 8 significant bits, so half a step is 2^-8 of the value
U_E4M3 = 2.0**-4   # unit roundoff of e4m3 normals (4 significant bits)
E4M3_HALF_SUBNORMAL_STEP = 2.0**-10  # e4m3 subnormals are multiples of 2^-9: absolute error at most half that
# fp8 tensor cores accumulate in less than f32 between cuBLASLt's promotions to f32; a generous allowance.
FP8_ACCUMULATION = 2.0**-10

# (encoding, group, out, cols, the implementations that must take it: the first is what `auto` runs).
# Odd outputs everywhere; fp8 with out or cols not multiples of 16 falls back to the bf16 path; cols not a
# multiple of 8 (and f32/f16 weights) only to the twin.
CASES = [
    ("bf16", None, 13, 72, ("twin", "bf16")),  # cols < 512: auto keeps the exact twin
    ("bf16", None, 67, 1024, ("bf16", "twin")),
    ("bf16", None, 9, 37, ("twin",)),
    ("f32", None, 7, 40, ("twin",)),
    ("f16", None, 5, 520, ("twin",)),
    ("fp8_e4m3", None, 80, 1040, ("fp8", "fp8_separate_scaling", "bf16", "twin")),
    ("fp8_e4m3", None, 16, 2048, ("fp8", "fp8_separate_scaling", "bf16", "twin")),
    ("fp8_e4m3", None, 67, 512, ("bf16", "twin")),
    ("fp8_e4m3", None, 64, 1032, ("bf16", "twin")),
    ("int8", 32, 11, 544, ("bf16", "twin")),
    ("int8", 128, 66, 1152, ("bf16", "streamed", "twin")),
    ("int4", 32, 13, 576, ("bf16", "twin")),
    ("int4", 64, 5, 1088, ("bf16", "twin")),
    ("int4", 128, 67, 4096, ("bf16", "streamed", "twin")),
    ("int4", 128, 300, 5120, ("bf16", "streamed", "twin")),  # several weight tiles, a partial last one
    ("int4", 256, 2100, 256, ("twin", "streamed", "bf16")),  # two steps: no column split; cols < 512: auto's twin
    ("int4_affine", 32, 13, 576, ("twin",)),  # bf16 would round its values: the exact twin only
    ("int4_affine", 64, 67, 1088, ("twin",)),
    ("nvfp4", None, 7, 48, ("twin", "bf16")),
    ("nvfp4", None, 71, 2048, ("bf16", "twin")),
]
FP8_FAMILY = ("fp8", "fp8_separate_scaling")  # auto takes the second where cuBLASLt lacks outer-vector scaling


def auto_choice(case: tuple, rows: int) -> tuple[str, ...]:
    """What `auto` may run: the streamed GEMM where it takes the weight, the inner dimension is not a test model's
    and rows are few, else the case's first implementation (either fp8 kind)."""
    _, _, _, cols, impls = case
    available = impls if _engine.cuda.cublaslt else ("twin",)
    if "streamed" in available and cols >= 512 and rows <= _engine.cuda.streamed_auto_rows:
        return ("streamed",)
    return FP8_FAMILY if available[0] in FP8_FAMILY else (available[0],)


def case_id(case: tuple) -> str:
    encoding, group, out, cols, _ = case
    return f"{encoding}{'-g' + str(group) if group else ''}-{out}x{cols}"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory):
    cases = [(case_id(case), case[0], case[1], (case[2], case[3])) for case in CASES]
    path, reference = weight_pairs_artifact(tmp_path_factory.mktemp("cuda-gemm") / "w.ninfer", cases,
                                            np.random.default_rng())
    art = _engine.Artifact.open(path)
    yield art, reference
    art.close()


def bf16_round(values: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(values, np.float32)))


def e4m3_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fp8 path's activations: per-row scales amax/448 (1 for a zero row) and the e4m3-rounded x/s, in f32
    exactly as the kernel computes them."""
    amax = np.abs(x).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
    return e4m3_to_f32(f32_to_e4m3(x / scale[:, None])), scale


def emulated(impl: str, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, w as the implementation multiplies them, in float64; the bound on |y - x w^T| from rounding them)."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    s_exact = np.abs(x64) @ np.abs(w64).T
    if impl == "streamed":  # the weights' codes and group scales are used as they are
        return bf16_round(x).astype(np.float64), w64, U_BF16 * s_exact
    if impl == "bf16":
        wb = bf16_round(w).astype(np.float64)
        u_w = 0.0 if np.array_equal(wb, w64) else U_BF16
        bound = ((1 + U_BF16) * (1 + u_w) - 1) * s_exact
        return bf16_round(x).astype(np.float64), wb, bound
    if impl in FP8_FAMILY:
        q, scale = e4m3_rows(x)
        bound = U_E4M3 * s_exact + E4M3_HALF_SUBNORMAL_STEP * scale[:, None].astype(np.float64) * (np.abs(w64).sum(1))
        return q.astype(np.float64) * scale[:, None], w64, bound
    return x64, w64, np.zeros_like(s_exact)


def accumulation_bound(impl: str, x: np.ndarray, w: np.ndarray, cols: int, bias: np.ndarray | None) -> np.ndarray:
    """f32 accumulation over `cols` terms in any order, the fp8 path's scale products and accumulator, and the
    bias addition."""
    s = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    bound = (cols + 3) * 2.0**-24 * s
    if impl in FP8_FAMILY:
        bound += FP8_ACCUMULATION * s
    if bias is not None:
        bound += 2.0**-23 * np.abs(bias).astype(np.float64)
    return bound + 1e-30


def check(got: np.ndarray, want: np.ndarray, bound: np.ndarray, what: str) -> None:
    assert np.isfinite(got).all(), f"{what}: {int((~np.isfinite(got)).sum())} unwritten or non-finite outputs"
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), (f"{what}: {int((err > bound).sum())} of {err.size} off; worst at {worst}: "
                                  f"{got[worst]} vs {want[worst]}, bound {bound[worst]:.3g}")


needs_cublaslt = pytest.mark.skipif(not getattr(_engine.cuda, "cublaslt", False),
                                    reason="this build has no cuBLASLt: every prefill GEMM runs on the twin")


@pytest.mark.parametrize("kind", ["codes", "real"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prefill_gemm_every_implementation(weights, case, kind: str) -> None:
    art, reference = weights
    _, _, out, cols, impls = case
    name = f"{kind}/{case_id(case)}"
    w = reference[name]
    rng = np.random.default_rng()
    available = impls if _engine.cuda.cublaslt else ("twin",)
    for rows in ROWS:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        bias = rng.standard_normal(out).astype(np.float32) if rows % 2 else None
        bias64 = 0.0 if bias is None else bias.astype(np.float64)
        exact = x.astype(np.float64) @ w.astype(np.float64).T + bias64
        twin, ran = _engine.cuda.gemm(x, art, name, "twin", bias)
        assert ran == "twin"
        twin_bound = accumulation_bound("twin", x, w, cols, bias)
        check(twin, exact, twin_bound, f"{name} twin rows={rows}")

        auto_output, auto_ran = _engine.cuda.gemm(x, art, name, "auto", bias)
        expected = auto_choice(case, rows)
        assert auto_ran in expected, f"{name}: auto ran {auto_ran}, expected {expected}"
        for impl in available:
            if impl == "twin":
                continue
            got, ran = _engine.cuda.gemm(x, art, name, impl, bias)
            assert ran == impl
            what = f"{name} {impl} rows={rows}"
            xe, we, rounding = emulated(impl, x, w)
            check(got, xe @ we.T + bias64, accumulation_bound(impl, xe, we, cols, bias), f"{what} vs emulated operands")
            fast_bound = rounding + accumulation_bound(impl, x, w, cols, bias)
            check(got, exact, fast_bound, f"{what} vs exact")
            check(got, twin.astype(np.float64), fast_bound + twin_bound, f"{what} vs twin")
            if impl == auto_ran:
                check(auto_output, exact, fast_bound, f"{name} auto ({auto_ran}) rows={rows} vs exact")


@needs_cublaslt
def test_prefill_gemm_refuses_what_it_cannot_run(weights) -> None:
    art, _ = weights
    from ninfer.errors import EngineError

    x = np.zeros((9, 37), np.float32)
    for impl in ("bf16", "fp8"):
        with pytest.raises(EngineError, match="cannot run"):
            _engine.cuda.gemm(x, art, "codes/bf16-9x37", impl)
    with pytest.raises(EngineError, match="cannot run"):
        _engine.cuda.gemm(np.zeros((9, 512), np.float32), art, "codes/fp8_e4m3-67x512", "fp8")
    with pytest.raises(EngineError, match="unknown GEMM"):
        _engine.cuda.gemm(x, art, "codes/bf16-9x37", "fast")


@needs_cublaslt
def test_fp8_activation_scales_follow_each_row(weights) -> None:
    """Rows of very different magnitudes (and an all-zero row) each get their own e4m3 scale: relative errors
    stay at the e4m3 level for every row, which a shared per-tensor scale would not give the small rows."""
    art, reference = weights
    name = "real/" + case_id(CASES[5])
    w = reference[name].astype(np.float64)
    rng = np.random.default_rng()
    x = rng.standard_normal((24, w.shape[1])).astype(np.float32)
    x *= (10.0 ** rng.uniform(-6, 6, 24)).astype(np.float32)[:, None]
    x[3] = 0
    for impl in FP8_FAMILY:
        got, _ = _engine.cuda.gemm(x, art, name, impl)
        exact = x.astype(np.float64) @ w.T
        _, _, rounding = emulated(impl, x, reference[name])
        bound = rounding + accumulation_bound(impl, x, reference[name], w.shape[1], None)
        check(got, exact, bound, f"{impl} vs exact")
        assert (got[3] == 0).all(), f"{impl}: the zero row"
