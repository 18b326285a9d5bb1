"""The routed experts on the GPU (CudaBackend::moe_experts): the grouped tensor-core matmul (moe_grouped.cu) and its
simple twin ("cuda-reference": one warp per output value) against a float64 reference and the CPU backend, for
every expert weight encoding the grouped path takes (and two it leaves to the simple kernels), on fresh random
codes (every code value, not only what the encoder emits) and random routings: 1..8 rows (decode) and a few
hundred (prefill), experts left with no token, one expert taking every row. Outputs are NaN-poisoned by the
bindings first.

Tolerance. The grouped path decodes every weight exactly into bf16 and splits its activations (x, then the SwiGLU
output h) into bf16 hi + lo, |v - hi - lo| <= 2^-16 |v|, with f32 products and sums; the simple twin and the CPU are
f32 throughout. Errors are measured against `magnitude`, the block's sums of |products| carried through SwiGLU
(|silu'| < 1.1) in float64: the worst case is ~2^-15 of it, but rounding errors of random sign stay far below.
A float32 emulation of the grouped arithmetic (bf16 round-to-nearest hi/lo, f32 sums in sequence) on these shapes
and codes measured at most 5.1e-7 of the magnitude (rms 5.2e-8; plain f32: 7.5e-8), so TOL = 2^-18 (3.8e-6) and
RMS_TOL = 2^-20 leave 7-18x for the tensor cores' own summation order. One lost lo plane (bf16 activations)
measured >= 1.2e-5 (rms >= 2e-6): both checks fail it; wrong codes, scales or column order fail by far more."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from artifact_files import random_codes, shape_of, write_artifact  # noqa: E402
from ninfer import _engine, _testing  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = 2.0**-18
RMS_TOL = 2.0**-20
# (encoding, group): what the grouped path takes (int groups of 128, the largest the format has), and what it leaves
# to the simple kernels (smaller int groups).
ENCODINGS = [("int4", 128), ("int8", 128), ("fp8_e4m3", None), ("nvfp4", None), ("bf16", None)]
SIMPLE_ONLY = [("int4", 64), ("int8", 32)]
# (experts, hidden, inter, top_k): fewer 128-column tiles than the block's 4 warps (256, 128 wide), tile counts 4
# does not divide (384, 640, 1152), and more than 8 (1152, 1280: a warp's register stages are each reloaded);
# Qwen3.5-MoE's top-8, and top-3 / top-2 over a few experts (each shared by many rows).
SHAPES = [(24, 256, 384, 8), (9, 640, 128, 3), (4, 1152, 1280, 2)]
ROW_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 300]


def shape_id(shape: tuple) -> str:
    experts, hidden, inter, top_k = shape
    return f"E{experts}-h{hidden}-i{inter}-k{top_k}"


def enc_id(enc: tuple) -> str:
    return f"{enc[0]}{'-g' + str(enc[1]) if enc[1] else ''}"


def names(enc: tuple, shape: tuple) -> tuple[str, str, str]:
    base = f"{enc_id(enc)}-{shape_id(shape)}"
    return f"{base}-gate", f"{base}-up", f"{base}-down"


@pytest.fixture(scope="module")
def experts(tmp_path_factory: pytest.TempPathFactory):
    """Stacked gate/up/down weights of random codes (no e4m3 NaN codes) per encoding and shape, and their values."""
    from ninfer.artifact.encodings import decode

    rng = np.random.default_rng()
    tensors = {}
    for enc in ENCODINGS + SIMPLE_ONLY:
        for shape in SHAPES:
            e, hidden, inter, _ = shape
            for name, dims in zip(names(enc, shape), ((e, inter, hidden), (e, inter, hidden), (e, hidden, inter)),
                                  strict=True):
                tensors[name] = random_codes(rng, enc[0], dims, enc[1], nan_codes=False)
    values = {name: decode(blobs, encoding, shape_of(encoding, blobs), group)
              for name, (encoding, group, blobs) in tensors.items()}
    art = _engine.Artifact.open(write_artifact(tmp_path_factory.mktemp("moe") / "experts.ninfer", tensors))
    yield art, values
    art.close()


@pytest.fixture(scope="module")
def backends():
    return _testing.cuda.Ops("cuda"), _testing.cuda.Ops("cuda-reference"), _testing.cuda.Ops("cpu")


def routing(rng: np.random.Generator, rows: int, experts: int, top_k: int, hot: int | None,
            unused: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """top_k distinct experts per row (never one of `unused`; `hot`, if given, in every row) and renormalised
    weights."""
    allowed = np.array([e for e in range(experts) if e not in unused and e != hot])
    # With a hot expert the others fill top_k - 1 slots (few experts may leave fewer than top_k allowed).
    others = np.stack([rng.choice(allowed, top_k - (hot is not None), replace=False) for _ in range(rows)])
    ids = others if hot is None else np.insert(others, rng.integers(top_k), hot, axis=1)
    ids = ids.astype(np.int32)
    w = rng.random((rows, top_k)).astype(np.float32) + 0.05
    return ids, (w / w.sum(1, keepdims=True)).astype(np.float32)


def silu(v: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(v))  # no overflow for large |v|
    return v * np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def exact(x: np.ndarray, ids: np.ndarray, w: np.ndarray, gate: np.ndarray, up: np.ndarray,
          down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the block's output in float64, the sums of |products| its error is measured against)."""
    x64, ax = x.astype(np.float64), np.abs(x.astype(np.float64))
    out, magnitude = np.zeros((x.shape[0], down.shape[1])), np.zeros((x.shape[0], down.shape[1]))
    for e in np.unique(ids):
        r, j = np.nonzero(ids == e)
        g, u = x64[r] @ gate[e].T, x64[r] @ up[e].T
        ga, ua = ax[r] @ np.abs(gate[e]).T, ax[r] @ np.abs(up[e]).T
        h = silu(g) * u
        ha = np.abs(silu(g)) * ua + 1.1 * np.abs(u) * ga + np.abs(h)
        np.add.at(out, r, w[r, j, None] * (h @ down[e].T))
        np.add.at(magnitude, r, w[r, j, None] * (ha @ np.abs(down[e]).T))
    return out, magnitude


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("enc", ENCODINGS + SIMPLE_ONLY, ids=enc_id)
def test_moe_experts_match_exact_and_cpu(experts, backends, enc, shape):
    art, reference = experts
    cuda, cuda_reference, cpu = backends
    n_experts, hidden, _, top_k = shape
    gate, up, down = names(enc, shape)
    assert _testing.cuda.moe_grouped_supports(art, gate, up, down) == (enc in ENCODINGS), "grouped path choice"
    weights64 = [reference[name].astype(np.float64) for name in (gate, up, down)]
    rng = np.random.default_rng()
    for rows in ROW_COUNTS:
        # Decode batches leave most experts empty; the prefill batch gets unused experts and one hot expert.
        hot, unused = (int(rng.integers(1, n_experts - 1)), {0, n_experts - 1}) if rows > 8 else (None, set())
        ids, w = routing(rng, rows, n_experts, top_k, hot, unused)
        x = rng.standard_normal((rows, hidden)).astype(np.float32)
        want, magnitude = exact(x, ids, w, *weights64)
        got = cuda.moe_experts(x, rows, hidden, ids, w, top_k, art, gate, up, down)
        twin = cuda_reference.moe_experts(x, rows, hidden, ids, w, top_k, art, gate, up, down)
        on_cpu = cpu.moe_experts(x, rows, hidden, ids, w, top_k, art, gate, up, down)
        bound = TOL * magnitude + 1e-30
        for what, y in (("grouped", got), ("simple twin", twin), ("cpu", on_cpu)):
            assert np.isfinite(y).all(), f"{what} rows={rows}: unwritten or non-finite outputs"
            err = np.abs(y - want)
            worst = np.unravel_index(np.argmax(err / bound), err.shape)
            assert (err <= bound).all(), (f"{what} rows={rows}: {int((err > bound).sum())} values off, worst at "
                                          f"{worst}: {y[worst]} vs {want[worst]} (bound {bound[worst]:.3g})")
        assert (np.abs(got - on_cpu) <= 2 * bound).all(), f"rows={rows}: grouped and CPU backends disagree"
        typical = float(np.sqrt(np.mean(((got - want) / magnitude) ** 2)))
        assert typical <= RMS_TOL, f"rows={rows}: rms error {typical:.3g} of the magnitude (at most {RMS_TOL:.3g})"


@pytest.mark.parametrize("enc", ENCODINGS, ids=enc_id)
def test_moe_experts_rows_are_batch_invariant(experts, backends, enc):
    """A row's result is bit-identical alone, in any batch, and from run to run (its place in its experts' buckets
    comes from atomics and varies)."""
    art, _ = experts
    cuda = backends[0]
    shape = SHAPES[0]
    n_experts, hidden, _, top_k = shape
    gate, up, down = names(enc, shape)
    rng = np.random.default_rng()
    rows = 200
    ids, w = routing(rng, rows, n_experts, top_k, hot=3, unused=set())
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    full = cuda.moe_experts(x, rows, hidden, ids, w, top_k, art, gate, up, down)
    np.testing.assert_array_equal(cuda.moe_experts(x, rows, hidden, ids, w, top_k, art, gate, up, down), full)
    for first, last in ((0, 1), (7, 15), (50, 90), (199, 200)):
        n = last - first
        alone = cuda.moe_experts(x[first:last], n, hidden, ids[first:last], w[first:last], top_k, art, gate, up, down)
        np.testing.assert_array_equal(alone, full[first:last], err_msg=f"rows {first}..{last - 1}")
