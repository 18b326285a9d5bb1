"""CUDA kernels against their CPU twins on fresh random inputs: the decode GEMV for every weight encoding
(`_testing.cuda.linear` vs `_testing.kernels.linear`, and both vs a float64 reference) and the gated-delta-rule decode
step (`_testing.cuda.gdn_decode` vs `_testing.gdn.recurrent`). Outputs are NaN-poisoned by the bindings first."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from artifact_files import weight_pairs_artifact  # noqa: E402
from ninfer import _engine, _testing  # noqa: E402

pytestmark = pytest.mark.gpu

# (encoding, group, out, cols): aligned shapes take the 16-byte path; odd ones the scalar path and tails.
WEIGHTS = [
    ("f32", None, 7, 37),
    ("f32", None, 33, 256),
    ("f16", None, 5, 515),
    ("bf16", None, 13, 577),
    ("bf16", None, 70, 1024),
    ("fp8_e4m3", None, 9, 1031),
    ("fp8_e4m3", None, 65, 2048),
    ("int8", 32, 11, 544),
    ("int8", 128, 66, 1152),
    ("int4", 32, 13, 576),
    ("int4", 64, 5, 1088),
    ("int4", 128, 67, 4096),
    ("int4", 32, 9, 96),
    ("int4_affine", 32, 13, 576),  # GGUF Q4_1 blocks (the embedded default), CUDA-core GEMV only
    ("int4_affine", 64, 66, 1088),
    ("int4_affine", 32, 9, 96),
    ("nvfp4", None, 7, 48),
    ("nvfp4", None, 71, 2048),
    # Tensor-core path shapes (whole 128-column tiles): few m-tiles and long rows split the columns over blocks.
    ("int4", 128, 24, 8192),
    ("int4", 128, 33, 2560),
    ("int8", 128, 3, 4096),
    ("bf16", None, 5, 640),
    ("fp8_e4m3", None, 17, 256),
    ("nvfp4", None, 3, 1024),
    # Edges of the v5 kernel's 16-byte chunks (int4 128 columns, 8-bit 64, bf16 32; 4 warps, a ring of 4 chunks):
    # fewer chunks than warps, chunk counts that leave warps uneven, a partial last m-tile, column splits whose
    # boundaries fall mid-ring or (int8) between the two chunks of a group.
    ("int4", 128, 19, 128),
    ("bf16", None, 17, 128),
    ("int4", 128, 40, 1408),
    ("int8", 128, 9, 2176),
    ("fp8_e4m3", None, 50, 3200),
    ("bf16", None, 33, 4224),
    ("nvfp4", None, 21, 1408),
    # int8 groups of 64 (the groupwise-int lm_head): one group a v5 chunk; an odd chunk count splits mid-ring.
    ("int8", 64, 37, 2048),
    ("int8", 64, 9, 2176),
    ("int8", 128, 5, 2048),  # beside int8-g64-37x2048 on one input: one launch a group size
]
# Which cases the tensor-core GEMV takes (gemv_mma_supports): every other one runs only the CUDA-core twin.
MMA_ENCODINGS = {"int4", "int8", "bf16", "fp8_e4m3", "nvfp4"}


def takes_mma(case: tuple, impl: str = "mma") -> bool:
    encoding, group, _, cols = case
    groups = (128,) if impl == "mma_v3" else (128, 64) if encoding == "int8" else (128,)
    return encoding in MMA_ENCODINGS and cols % 128 == 0 and (group is None or group in groups)


# The tensor-core kernel (v5) and its variants, until a GPU run has compared them: v5 without its L2 prefetch, v3
# (groups of 128 only).
MMA_IMPLS = ("mma", "mma_v3")
GEMV_CASES = [(case, impl) for case in WEIGHTS for impl in ("simt", *MMA_IMPLS)
              if impl == "simt" or takes_mma(case, impl)]
MMA_CASES = [(case, impl) for case in WEIGHTS for impl in MMA_IMPLS if takes_mma(case, impl)]


def case_id(case: tuple) -> str:
    encoding, group, out, cols = case
    return f"{encoding}{'-g' + str(group) if group else ''}-{out}x{cols}"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory):
    cases = [(case_id(case), case[0], case[1], (case[2], case[3])) for case in WEIGHTS]
    path, reference = weight_pairs_artifact(tmp_path_factory.mktemp("cuda") / "w.ninfer", cases,
                                            np.random.default_rng())
    art = _engine.Artifact.open(path)
    yield art, reference
    art.close()


@pytest.mark.parametrize("kind", ["codes", "real"])
@pytest.mark.parametrize("case,impl", GEMV_CASES, ids=lambda v: case_id(v) if isinstance(v, tuple) else v)
def test_gemv_matches_cpu_twin(weights, case, impl: str, kind: str) -> None:
    art, reference = weights
    name = f"{kind}/{case_id(case)}"
    w64 = reference[name].astype(np.float64)
    rng = np.random.default_rng()
    for rows in range(1, 9):
        # Rows of very different magnitudes: the tensor-core path scales each row into fp16's range on its own.
        magnitudes = 10.0 ** rng.uniform(-6, 6, size=(rows, 1)) if impl in MMA_IMPLS else 1.0
        x = (rng.standard_normal((rows, case[3])) * magnitudes).astype(np.float32)
        gpu = _testing.cuda.linear(x, art, name, impl)
        cpu = _testing.kernels.linear(x, art, name)
        exact = x.astype(np.float64) @ w64.T
        assert np.isfinite(gpu).all(), f"{name} rows={rows}: unwritten or non-finite outputs"
        # f32 accumulation in different orders: errors scale with sum |x_i w_i| per output.
        bound = 2e-6 * (np.abs(x).astype(np.float64) @ np.abs(w64).T) * np.sqrt(case[3]) + 1e-30
        assert (np.abs(gpu - exact) <= bound).all(), f"{name} rows={rows}: max err {np.abs(gpu - exact).max()}"
        assert (np.abs(gpu - cpu) <= 2 * bound).all(), f"{name} rows={rows}: GPU and CPU twins disagree"


@pytest.mark.parametrize("case,impl", MMA_CASES, ids=lambda v: case_id(v) if isinstance(v, tuple) else v)
def test_gemv_mma_rows_are_batch_invariant(weights, case, impl: str) -> None:
    """A row's result is bit-identical alone and in any batch (the runtime's lanes == single runs relies on it);
    v5 runs batches of up to 4 rows and of 5..8 rows by different kernels, so both are compared."""
    art, _ = weights
    name = f"real/{case_id(case)}"
    x = np.random.default_rng().standard_normal((8, case[3])).astype(np.float32)
    batched = _testing.cuda.linear(x, art, name, impl)
    for r in range(8):
        alone = _testing.cuda.linear(x[r:r + 1], art, name, impl)
        np.testing.assert_array_equal(alone[0], batched[r])
    np.testing.assert_array_equal(_testing.cuda.linear(x[3:6], art, name, impl), batched[3:6])
    np.testing.assert_array_equal(_testing.cuda.linear(x[:5], art, name, impl), batched[:5])


@pytest.mark.parametrize("impl", MMA_IMPLS)
@pytest.mark.parametrize("case", [("bf16", None, 17, 128), ("bf16", None, 33, 4224), ("int4", 128, 40, 1408)],
                         ids=case_id)
def test_gemv_mma_takes_activations_at_any_float_offset(weights, case, impl: str) -> None:
    """Activations that do not start on 16 bytes (a slice of a row) give the aligned result bit for bit: v5 reads
    bf16 weights' f32 activations itself, with vector loads only when they are aligned; the other encodings read
    the split planes."""
    art, _ = weights
    name = f"real/{case_id(case)}"
    x = np.random.default_rng().standard_normal((6, case[3])).astype(np.float32)
    for rows in (1, 6):
        aligned = _testing.cuda.linear(x[:rows], art, name, impl)
        for offset in (1, 2, 3):
            np.testing.assert_array_equal(_testing.cuda.linear(x[:rows], art, name, impl, x_offset=offset), aligned,
                                          err_msg=f"{name} rows={rows} x_offset={offset}")


@pytest.mark.parametrize("case", [c for c in WEIGHTS if takes_mma(c) and c[0] == "bf16"], ids=case_id)
def test_gemv_mma_register_split_equals_planes(weights, case) -> None:
    """v5 splits bf16 weights' activations in registers; "mma_planes" reads the split kernel's planes instead (the
    quantized encodings always do). Both give the same bits: rows of very different magnitudes, an all-zero row,
    aligned and misaligned activations, 1-4 and 5-8 rows (the two kernels of v5)."""
    art, _ = weights
    name = f"real/{case_id(case)}"
    rng = np.random.default_rng()
    for rows in range(1, 9):
        x = (rng.standard_normal((rows, case[3])) * 10.0 ** rng.uniform(-6, 6, size=(rows, 1))).astype(np.float32)
        if rows >= 3:
            x[rng.integers(rows)] = 0.0
        for offset in (0, 1):
            np.testing.assert_array_equal(
                _testing.cuda.linear(x, art, name, "mma", x_offset=offset),
                _testing.cuda.linear(x, art, name, "mma_planes", x_offset=offset),
                err_msg=f"{name} rows={rows} x_offset={offset}")


def test_gemv_mma_refuses_what_it_does_not_take(weights) -> None:
    art, _ = weights
    from ninfer.errors import EngineError

    with pytest.raises(EngineError, match="tensor-core"):
        _testing.cuda.linear(np.zeros((1, 96), np.float32), art, "codes/int4-g32-9x96", "mma")
    with pytest.raises(EngineError, match="v3 kernel takes groups of 128"):
        _testing.cuda.linear(np.zeros((1, 2048), np.float32), art, "codes/int8-g64-37x2048", "mma_v3")


def test_gemv_refuses_too_many_rows(weights) -> None:
    art, _ = weights
    from ninfer.errors import EngineError

    with pytest.raises(EngineError, match="1..8"):
        _testing.cuda.linear(np.zeros((9, 37), np.float32), art, "codes/f32-7x37")


def _normalised(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    x = rng.standard_normal(shape)
    x /= np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
    return (x * scale).astype(np.float32)


@pytest.mark.parametrize(
    "hk,hv,dk,dv",
    [(2, 4, 16, 16), (1, 3, 32, 40), (2, 2, 64, 96), (16, 48, 128, 128), (4, 8, 256, 64)],
)
def test_gdn_decode_matches_cpu_recurrence(hk: int, hv: int, dk: int, dv: int) -> None:
    rng = np.random.default_rng()
    batch, steps = 3, 5
    states_gpu = rng.standard_normal((batch, hv, dk, dv)).astype(np.float32) * 0.1
    states_cpu = states_gpu.copy()
    for _ in range(steps):
        q = _normalised(rng, (batch, hk, dk), dk**-0.5)
        k = _normalised(rng, (batch, hk, dk))
        v = rng.standard_normal((batch, hv, dv)).astype(np.float32)
        g = -np.exp(rng.standard_normal((batch, hv))).astype(np.float32) * 0.3
        beta = (1 / (1 + np.exp(-rng.standard_normal((batch, hv))))).astype(np.float32)
        out_gpu, states_gpu = _testing.cuda.gdn_decode(q, k, v, g, beta, states_gpu)
        for b in range(batch):
            out_cpu, new_state = _testing.gdn.recurrent(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1],
                                                       beta[b:b + 1], states_cpu[b])
            states_cpu[b] = new_state
            np.testing.assert_allclose(out_gpu[b], out_cpu[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(states_gpu, states_cpu, rtol=1e-4, atol=1e-5)


# Weights whose decode GEMV reads split planes (the fp16 kinds: every tensor-core encoding but bf16).
PLANES_CASES = [c for c in WEIGHTS if takes_mma(c) and c[0] != "bf16"]


def _residual_rows(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hidden, delta, norm weight): rows 10^-6..10^6 apart, so that the fp16 row exponents differ."""
    scale = 10.0 ** rng.uniform(-6, 6, size=(rows, 1))
    hidden = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    delta = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    return hidden, delta, rng.standard_normal(cols).astype(np.float32)


@pytest.mark.parametrize("case", PLANES_CASES, ids=case_id)
def test_add_rmsnorm_writes_the_split_planes(weights, case) -> None:
    """The norm that writes the decode GEMV's split planes itself gives the same hidden, output and plane bits as
    the norm followed by the split kernel (its twin), at 1..8 rows, including an all-zero row."""
    art, _ = weights
    name = f"real/{case_id(case)}"
    rng = np.random.default_rng()
    for rows in range(1, 9):
        hidden, delta, w = _residual_rows(rng, rows, case[3])
        if rows >= 3:
            zero = rng.integers(rows)
            hidden[zero], delta[zero] = 0.0, 0.0
        fused = _testing.cuda.add_rmsnorm_planes(hidden, delta, w, art, name, True)
        twin = _testing.cuda.add_rmsnorm_planes(hidden, delta, w, art, name, False)
        np.testing.assert_array_equal(fused[0], twin[0], err_msg=f"{name} rows={rows}: hidden")
        np.testing.assert_array_equal(fused[1], twin[1], err_msg=f"{name} rows={rows}: out")
        assert fused[2] == twin[2], f"{name} rows={rows}: planes differ"


# Projections sharing one normed input (the first is the one norm_feeds names).
FEEDING_GROUPS = [[f"real/{case_id(c)}"] for c in PLANES_CASES] + [
    ["real/nvfp4-3x1024", "real/bf16-70x1024"],  # planes for the first weight's kind, bf16 split in registers
    ["real/int4-g128-67x4096", "real/int8-g128-3x4096"],  # two fp16 kinds on one input: the second splits again
    ["real/int8-g64-37x2048", "real/int8-g128-5x2048"],  # one kind, two group sizes: two v5 launches on one split
]


@pytest.mark.parametrize("group", FEEDING_GROUPS, ids=lambda g: "+".join(n.split("/")[1] for n in g))
def test_norm_feeding_projections_equals_its_twin(weights, group) -> None:
    """A decode layer's add_rmsnorm with the norm_feeds hint, then the projections on its output: the CUDA backend
    (the norm writes the planes) gives the bits of its reference twin (norm, then split kernel), 1..8 rows."""
    art, _ = weights
    rng = np.random.default_rng()
    cols = next(c[3] for c in WEIGHTS if f"real/{case_id(c)}" == group[0])
    fast, twin = _testing.cuda.Ops("cuda"), _testing.cuda.Ops("cuda-reference")
    for rows in (1, 2, 4, 5, 8):
        hidden, delta, w = _residual_rows(rng, rows, cols)
        got = fast.add_rmsnorm_linear(hidden, delta, rows, cols, w, True, 1e-6, art, group)
        want = twin.add_rmsnorm_linear(hidden, delta, rows, cols, w, True, 1e-6, art, group)
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"{group} rows={rows}: out")
        for name, y, y_twin in zip(group, got[2], want[2]):
            np.testing.assert_array_equal(y, y_twin, err_msg=f"{name} rows={rows}")
