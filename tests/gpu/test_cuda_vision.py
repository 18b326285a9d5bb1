"""The CUDA backend's vision tower against the CPU backend.

Ops (`_testing.cuda.Ops("cuda")` vs `Ops("cpu")`, outputs NaN-poisoned first, fresh random inputs): layernorm, both
GELUs, add_embedding_mix over f32 and bf16 tables, segment_attention over several segment layouts and head sizes
(against its bf16 rounding model and the float64 reference, and rows outside every segment left unwritten), rope with two and three
position streams. End to end, on the tiny Qwen3.5 dense and MoE artifacts (conftest's tiny_artifacts): the tower's
rows for images and videos, and whole-model logits with one image, two images, a video and a mix (prefill, then
decoding at index + delta), backend="cuda" against backend="cpu"; and the op timing of an encode
(Model.open(op_times=True), what bench/vision_tower.py --op-times reads)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import vision_op_refs as ref
from artifact_files import encoded, write_artifact
from ninfer import _engine, _testing
from vision_prompts import build_prompt, media_rows

pytestmark = pytest.mark.gpu

# The tiny models' GEMMs take the exact f32 twin (their inner dimensions are below the fast paths' minimum), so
# the backends differ by f32 summation order (~1e-5 of the scale) and by the CUDA segment attention's bf16
# inputs: its outputs are off by ~2^-8 (4e-3) of their scale (2^-7 for v's and P's rounding at worst, plus the
# scores'; test_segment_attention checks the bound), and the one-block tiny tower passes that on through its
# projection, MLP and merger with little gain: 2e-2 leaves a factor of ~5 over the typical error, while a wrong
# segment or a dropped key tile is off by O(1).
TOWER_TOL = 2e-2
# Logits of prompts with media: the vision rows carry the tower's error into the text model (linear to first
# order), so the same 2e-2 of the logits' scale; text-only logits are held to 1e-3 in tests/gpu/test_cuda_backend.py.
LOGIT_TOL = 2e-2


@pytest.fixture
def ops():
    return _testing.cuda.Ops("cuda"), _testing.cuda.Ops("cpu")


def rng() -> np.random.Generator:
    return np.random.default_rng()


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float | np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    assert np.isfinite(got).all(), f"{what}: {int((~np.isfinite(got)).sum())} unwritten or non-finite outputs"
    err = np.abs(got.astype(np.float64) - want)
    bound = rtol * np.abs(want) + atol
    assert (err <= bound).all(), f"{what}: {int((err > bound).sum())} values off, max err {err.max():.3g}"


@pytest.mark.parametrize("rows,dim", [(1, 16), (37, 1152), (5, 1000), (300, 64)])
def test_layernorm(ops, rows, dim):
    cuda, cpu = ops
    x = (rng().standard_normal((rows, dim)) * 3 + 40).astype(np.float32)  # far from zero mean
    w, b = rng().standard_normal(dim).astype(np.float32), rng().standard_normal(dim).astype(np.float32)
    got = cuda.layernorm(x, rows, dim, w, b, 1e-6)
    assert_close(got, cpu.layernorm(x, rows, dim, w, b, 1e-6), 1e-5, 1e-5, "layernorm vs cpu")
    assert_close(got, ref.layernorm(x, w, b, 1e-6), 1e-5, 1e-5, "layernorm vs float64")


@pytest.mark.parametrize("kind", ["tanh", "erf"])
@pytest.mark.parametrize("n", [1, 1003, 1 << 18])
def test_gelu(ops, kind, n):
    cuda, cpu = ops
    x = (rng().standard_normal(n) * 5).astype(np.float32)
    # CUDA's tanhf / erff and glibc's differ by a few ulp of the (1 + tanh) or (1 + erf) factor, which 0.5 x scales:
    # an error of ~1e-7 |x|, large against tiny results (x far below zero, where 1 + erf cancels).
    assert_close(cuda.gelu(x, kind), cpu.gelu(x, kind), 1e-6, 1e-6 * np.abs(x).astype(np.float64) + 1e-7,
                 f"gelu {kind}")


@pytest.mark.parametrize("encoding", ["f32", "bf16"])
def test_add_embedding_mix(ops, tmp_path, encoding):
    cuda, cpu = ops
    table = rng().standard_normal((2304, 72)).astype(np.float32)
    art = _engine.Artifact.open(str(write_artifact(tmp_path / "t.ninfer", {"pos": encoded(table, encoding)})))
    for rows, taps in [(1, 4), (517, 4), (33, 3)]:
        x = rng().standard_normal((rows, 72)).astype(np.float32)
        ids = rng().integers(0, 2304, (rows, taps)).astype(np.int32)
        weights = rng().uniform(0, 1, (rows, taps)).astype(np.float32)
        assert_close(cuda.add_embedding_mix(x, ids, weights, taps, art, "pos"),
                     cpu.add_embedding_mix(x, ids, weights, taps, art, "pos"), 1e-6, 1e-6, "add_embedding_mix")


UNEVEN = [(0, 1), (1, 63), (64, 64), (128, 65), (193, 300)]  # partial, whole and one-past query and key tiles
SEGMENT_CASES = [  # (heads, head_dim, segments, rows)
    (1, 8, [(0, 1)], 1),
    (2, 8, [(0, 16), (16, 16), (32, 48)], 80),
    (16, 72, [(0, 300)], 300),  # the released tower's head size (padded to 80); partial last query and key tiles
    (3, 64, [(0, 5), (7, 129), (136, 64)], 210),  # rows 5, 6 and 200.. in no segment
    (4, 128, [(10, 97)], 120),
    (2, 4, [(0, 33), (33, 31)], 64),
    (16, 72, UNEVEN, 500),  # rows 493.. in no segment
    (2, 8, UNEVEN, 493),  # the tiny towers' head size
    (2, 52, UNEVEN[1:], 493),  # a head that is not a multiple of 8 (padded to 64)
    (4, 72, [(0, 1000), (1000, 24)], 1024),  # 16 key tiles through the two shared-memory stages, then a short one
]


@pytest.mark.parametrize("heads,head_dim,segments,rows", SEGMENT_CASES)
def test_segment_attention(ops, heads, head_dim, segments, rows):
    """The tensor-core kernel against its rounding model (tight: only P's bf16 rounding and f32 scores are left)
    and against the exact result and the f32 CPU twin (the bf16 inputs' worst-case first-order bound);
    vision_op_refs.segment_attention_bf16 derives both bounds."""
    cuda, cpu = ops
    stride = 3 * heads * head_dim  # the tower's fused qkv rows
    q, k, v = (rng().standard_normal((rows, stride)).astype(np.float32) * 2 for _ in range(3))
    scale = float(head_dim) ** -0.5
    got = cuda.segment_attention(q, k, v, stride, segments, heads, head_dim, scale)
    want = ref.segment_attention(q, k, v, segments, heads, head_dim, scale)
    outside = np.isnan(want).all(axis=1)
    assert np.isnan(got[outside]).all(), "rows outside every segment were written"
    inside = ~outside
    rounded, near, far = (x[inside] for x in ref.segment_attention_bf16(q, k, v, segments, heads, head_dim, scale))
    assert_close(got[inside], rounded, 1e-5, near + 1e-5, "segment_attention vs its bf16 rounding model")
    assert_close(got[inside], want[inside], 1e-5, far + 1e-5, "segment_attention vs float64")
    # The CPU twin is within (1e-5, 1e-5) of the float64 result (tests/test_backend_ops_vision.py).
    mine = cpu.segment_attention(q, k, v, stride, segments, heads, head_dim, scale)
    assert_close(got[inside], mine[inside].astype(np.float64), 2e-5, far + 2e-5, "segment_attention vs cpu")


def test_segment_attention_refuses_what_it_cannot_take(ops):
    cuda, _ = ops
    q = rng().standard_normal((4, 3 * 136)).astype(np.float32)
    with pytest.raises(Exception, match="head_dim 136 must be a multiple of 4 up to 128"):
        cuda.segment_attention(q, q, q, 3 * 136, [(0, 4)], 1, 136, 0.1)


@pytest.mark.parametrize("streams,rows,heads,head_dim", [(2, 300, 16, 72), (3, 13, 4, 64), (2, 1, 2, 8)])
def test_rope_with_streams(ops, streams, rows, heads, head_dim):
    cuda, cpu = ops
    stride = 3 * heads * head_dim
    x = rng().standard_normal((rows, stride)).astype(np.float32)
    inv_freq = (1.0 / 10_000 ** (np.arange(0, head_dim, 2) / head_dim)).astype(np.float32)
    freq_stream = rng().integers(0, streams, len(inv_freq)).astype(np.uint8)
    positions = rng().integers(0, 40_000, (rows, streams)).astype(np.int64).ravel()
    got = cuda.rope(x, rows, heads, head_dim, stride, positions, inv_freq, False, freq_stream)
    assert_close(got, cpu.rope(x, rows, heads, head_dim, stride, positions, inv_freq, False, freq_stream).astype(
        np.float64), 1e-5, 1e-5, "rope streams")


# ---------- end to end ----------

KINDS = ["qwen3_5", "qwen3_5_moe"]


@pytest.fixture(scope="module", params=KINDS)
def models(request, tiny_artifacts):
    path = str(tiny_artifacts[request.param])
    return tuple(_testing.Model.open(path, kv_dtype="f32", threads=2, max_context=1024, backend=b, vision=True)
                 for b in ("cuda", "cpu"))


def patch_values(model) -> int:
    v = model.config["vision"]
    return v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2


def close_to_scale(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    assert got.shape == want.shape and np.isfinite(got).all(), what
    err = float(np.abs(got - want).max())
    assert err <= tol * float(np.abs(want).max()), f"{what}: max err {err:.3g} of max {np.abs(want).max():.3g}"


@pytest.mark.parametrize("grids", [[(1, 4, 4)], [(1, 8, 6), (1, 2, 10)], [(3, 4, 6)], [(2, 6, 4), (1, 16, 16)]],
                         ids=["image", "two-images", "video", "video-and-image"])
def test_tower_matches_cpu(models, grids):
    cuda, cpu = models
    rows = sum(t * h * w for t, h, w in grids)
    patches = rng().uniform(-1, 1, (rows, patch_values(cpu))).astype(np.float32)
    close_to_scale(cuda.encode_vision(patches, grids), cpu.encode_vision(patches, grids), TOWER_TOL, "tower")


def test_op_times_split_an_encode(tiny_artifacts):
    """A model opened with op_times (bench/vision_tower.py --op-times) times each backend op of an encode: one
    segment_attention per tower block, with device time, and the same rows as a model without the events."""
    path = str(tiny_artifacts["qwen3_5"])
    timed, plain = (_testing.Model.open(path, kv_dtype="f32", max_context=1024, backend="cuda", vision=True,
                                       op_times=on) for on in (True, False))
    grids = [(1, 8, 6), (1, 2, 10)]
    patches = rng().uniform(-1, 1, (68, patch_values(plain))).astype(np.float32)
    before = timed.op_times()
    got = timed.encode_vision(patches, grids)
    after = timed.op_times()
    attention, was = after["segment_attention"], before.get("segment_attention", {"calls": 0, "device_us": 0.0})
    assert attention["calls"] - was["calls"] == timed.config["vision"]["depth"]
    assert attention["device_us"] > was["device_us"]
    assert plain.op_times() == {}
    close_to_scale(got, plain.encode_vision(patches, grids), 1e-6, "timed encode vs plain")


MEDIA = {
    "one-image": [("image", (1, 8, 6))],
    "two-images": [("image", (1, 4, 4)), ("image", (1, 6, 10))],
    "video": [("video", (3, 4, 6))],
    "image-and-video": [("video", (2, 6, 4)), ("image", (1, 2, 8))],
}


@pytest.mark.parametrize("media", MEDIA.values(), ids=MEDIA.keys())
def test_logits_with_media_match_cpu(models, media):
    cuda, cpu = models
    prompt = build_prompt(media, patch_values(cpu), seed=int(rng().integers(1 << 30)))
    extra = rng().integers(0, 240000, 4).astype(np.int32)
    results = []
    for model in (cuda, cpu):
        rows = media_rows(prompt, model.encode_vision(prompt.patches, prompt.grids))
        seq = model.new_sequence()
        logits = [model.prefill(seq, prompt.tokens, all_logits=True, media=rows, mrope_positions=prompt.positions)]
        logits += [model.decode(seq, int(t), position_offset=prompt.delta) for t in extra]
        model.release(seq)
        results.append(np.concatenate(logits))
    close_to_scale(results[0], results[1], LOGIT_TOL, "prefill and decode logits")
