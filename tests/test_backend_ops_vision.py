"""The CPU backend's vision-tower ops through `_testing.cuda.Ops("cpu")` (the binding the GPU tests compare the CUDA
backend with) against float64 numpy references on fresh random inputs: layernorm, both GELUs, add_embedding_mix,
segment_attention (several segments: no row may see another segment's) and rope with two and three position
streams. tests/gpu/test_cuda_vision.py runs the same cases on the CUDA backend against these."""

from __future__ import annotations

import numpy as np
import pytest
import vision_op_refs as ref
from artifact_files import encoded, write_artifact
from ninfer import _engine, _testing
from ninfer.errors import EngineError


@pytest.fixture(scope="module")
def cpu():
    return _testing.cuda.Ops("cpu")


def close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    assert got.shape == want.shape and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_layernorm(cpu):
    rng = np.random.default_rng()
    for rows, dim in [(1, 16), (9, 1152), (4, 77)]:
        x = (rng.standard_normal((rows, dim)) * 3 + 40).astype(np.float32)  # far from zero mean
        w, b = rng.standard_normal(dim).astype(np.float32), rng.standard_normal(dim).astype(np.float32)
        close(cpu.layernorm(x, rows, dim, w, b, 1e-6), ref.layernorm(x, w, b, 1e-6), 1e-5, 1e-5)


@pytest.mark.parametrize("kind", ["tanh", "erf"])
def test_gelu(cpu, kind):
    x = (np.random.default_rng().standard_normal(1000) * 4).astype(np.float32)
    close(cpu.gelu(x, kind), ref.gelu(x, kind), 1e-5, 1e-6)
    with pytest.raises(EngineError, match="kind must be"):
        cpu.gelu(x, "relu")


def test_add_embedding_mix(cpu, tmp_path):
    rng = np.random.default_rng()
    table = rng.standard_normal((36, 24)).astype(np.float32)
    path = write_artifact(tmp_path / "t.ninfer", {"pos": encoded(table, "f32")})
    art = _engine.Artifact.open(str(path))
    rows, taps = 13, 4
    x = rng.standard_normal((rows, 24)).astype(np.float32)
    ids = rng.integers(0, 36, (rows, taps)).astype(np.int32)
    weights = rng.uniform(0, 1, (rows, taps)).astype(np.float32)
    close(cpu.add_embedding_mix(x, ids, weights, taps, art, "pos"), ref.embedding_mix(x, table, ids, weights), 1e-5,
          1e-5)
    ids[3, 1] = 36
    with pytest.raises(EngineError, match="row 36 outside the table of 36"):
        cpu.add_embedding_mix(x, ids, weights, taps, art, "pos")


def test_segment_attention(cpu):
    rng = np.random.default_rng()
    heads, head_dim = 3, 8
    stride = 3 * heads * head_dim
    segments = [(0, 5), (5, 70), (80, 1)]  # rows 75..79 belong to none
    rows = 81
    q, k, v = (rng.standard_normal((rows, stride)).astype(np.float32) for _ in range(3))
    want = ref.segment_attention(q, k, v, segments, heads, head_dim, 0.35)
    got = cpu.segment_attention(q, k, v, stride, segments, heads, head_dim, 0.35)
    outside = np.isnan(want).all(axis=1)
    assert outside.sum() == 5 and np.isnan(got[outside]).all()  # poison kept: nothing written there
    close(got[~outside], want[~outside], 1e-5, 1e-6)
    with pytest.raises(EngineError, match="outside the rows"):
        cpu.segment_attention(q, k, v, stride, [(60, 30)], heads, head_dim, 0.35)


@pytest.mark.parametrize("streams", [2, 3])
def test_rope_with_streams(cpu, streams):
    rng = np.random.default_rng()
    rows, heads, head_dim = 11, 2, 24
    stride = heads * head_dim + 4
    x = rng.standard_normal((rows, stride)).astype(np.float32)
    inv_freq = (1.0 / 10_000 ** (np.arange(0, head_dim, 2) / head_dim)).astype(np.float32)
    freq_stream = rng.integers(0, streams, len(inv_freq)).astype(np.uint8)
    positions = rng.integers(0, 5000, (rows, streams)).astype(np.int64)
    got = cpu.rope(x, rows, heads, head_dim, stride, positions.ravel(), inv_freq, False, freq_stream)
    want = ref.rope_streams(x, heads, head_dim, positions, inv_freq, freq_stream)
    close(got, want, 1e-5, 1e-5)
    with pytest.raises(EngineError, match="stream past the last"):
        cpu.rope(x, rows, heads, head_dim, stride, positions.ravel(), inv_freq, False, freq_stream + streams)
