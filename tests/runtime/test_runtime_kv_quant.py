"""8-bit KV rows (fp8 e4m3 / int8 with one scale per (token, head) row) within the bound of their own rounding:
the codec alone, the pool + CPU attention against exact attention over round-tripped rows, and whole models.

The model-level bound. KV rounding perturbs attention inputs by a relative error delta per value; for small
delta the logits move linearly in it, so a dtype's logit error is about (delta / delta_bf16) times bf16's, which
the model parity tests hold against HF. Per value, relative to the row's largest value:
- bf16: 2^-9 (8 significant bits), the unit.
- int8: half a step, amax / 254 ~ 2^-8; relative to a typical value (a Gaussian row's max is ~3x its rms) that
  is ~6x bf16's.
- fp8 e4m3: 2^-4 (4 significant bits), 32x bf16's.
So the test measures bf16's logit error against f32 KV on the same model and tokens, and requires each 8-bit
dtype's to stay within ROOM x ratio x that (ROOM = 2 for error growth being uneven). Measured (70 tokens, max
|delta logit| / logit scale): llama bf16 2.6e-3, int8 7.2e-3, fp8 3.8e-2; Qwen3.5 bf16 2.5e-3, int8 6.0e-3,
fp8 2.9e-2, i.e. ratios ~2.5 and ~13, inside the estimates. The exact check of the pool and kernel is the
attention test above (f32 rounding of exact attention over the round-tripped rows).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import run_alone
from ninfer import _testing, errors
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

# delta / delta_bf16 per dtype (module docstring) and the room left over the linear estimate.
ROUNDING_RATIO = {"bf16": 1.0, "int8": 6.0, "fp8": 32.0}
ROOM = 2.0


def rows(rng: np.random.Generator):
    for scale in (1e-3, 1.0, 40.0):
        yield (rng.normal(0, scale, size=128)).astype(np.float32)
    spiky = rng.normal(0, 1, size=64).astype(np.float32)
    spiky[7] = 300.0  # one outlier sets the scale of the whole row
    yield spiky
    yield np.zeros(64, dtype=np.float32)


def test_int8_rows_round_to_half_a_step():
    rng = np.random.default_rng()
    for x in rows(rng):
        got = np.array(_testing.kv_quant_roundtrip(x.tolist(), "int8"), dtype=np.float32)
        step = np.abs(x).max() / 127
        assert np.all(np.abs(got - x) <= step / 2 * (1 + 1e-5) + 1e-30)


def test_fp8_rows_keep_three_mantissa_bits():
    rng = np.random.default_rng()
    for x in rows(rng):
        got = np.array(_testing.kv_quant_roundtrip(x.tolist(), "fp8"), dtype=np.float32)
        scale = np.abs(x).max() / 448
        # e4m3: relative error 2^-4 for normal values, absolute 2^-10 * scale in the subnormal range.
        bound = np.maximum(np.abs(x) * 2.0**-4, 2.0**-10 * scale) * (1 + 1e-5)
        assert np.all(np.abs(got - x) <= bound + 1e-30)
        assert np.abs(got).max() == pytest.approx(np.abs(x).max(), rel=1e-6)  # the largest value is exact


def test_other_dtypes_are_not_row_formats():
    with pytest.raises(errors.EngineError, match="not an 8-bit row format"):
        _testing.kv_quant_roundtrip([1.0, 2.0], "bf16")


# ---------- the pool and the CPU attention on 8-bit rows ----------

def bf16_rounded(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 (nearest even) and back, as the bf16 pool stores it."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def quantized(rows: np.ndarray, kv_heads: int, dtype: str) -> np.ndarray:
    """What a pool of `dtype` holds for [tokens, kv_heads * d] rows: f32 as is, bf16 rounded, 8-bit rows (each
    (token, head) row) round-tripped alone."""
    if dtype == "f32":
        return rows
    if dtype == "bf16":
        return bf16_rounded(rows)
    d = rows.shape[1] // kv_heads
    out = [_testing.kv_quant_roundtrip(r.tolist(), dtype) for r in rows.reshape(-1, d)]
    return np.array(out, dtype=np.float32).reshape(rows.shape)


def attention_reference(q, keys, values, starts, counts, heads, kv_heads, d, scale) -> np.ndarray:
    """Causal GQA softmax attention in float64: row i of a sequence sees its positions 0 .. start + i."""
    out, row = [], 0
    for keys_s, values_s, start, n in zip(keys, values, starts, counts):
        k = keys_s.reshape(-1, kv_heads, d).astype(np.float64)
        v = values_s.reshape(-1, kv_heads, d).astype(np.float64)
        for i in range(n):
            qr = q[row + i].reshape(heads, 2 * d)[:, :d].astype(np.float64)  # [q | gate] per head
            o = np.empty((heads, d))
            for h in range(heads):
                kh = h // (heads // kv_heads)
                s = k[:start + i + 1, kh] @ qr[h] * scale
                p = np.exp(s - s.max())
                o[h] = (p / p.sum()) @ v[:start + i + 1, kh]
            out.append(o.reshape(-1))
        row += n
    return np.array(out)


@pytest.mark.parametrize("d", [32, 36], ids=["d32-vector", "d36-scalar"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "fp8", "int8"])
def test_attention_reads_pages_with_their_scales(dtype, d):
    """kv_write stores each (token, head) row (8-bit dtypes: quantized, its scale beside the page); attention must
    then equal exact attention over the stored K and V (f32 rounding only). Pages are a random permutation of the
    pool and rows are scaled per head, so a wrong page, offset, head or scale slot shows. head_dim 32 takes the
    vectorised kernel (vector exp included), 36 the scalar one."""
    rng = np.random.default_rng()
    ops = _testing.cuda.Ops("cpu")
    heads, kv_heads = 4, 2
    spec = [(63, 2), (0, 5), (100, 30)]  # (history, new): page-crossing history, an empty one, a prefill
    pages_needed = [(h + n + 63) // 64 for h, n in spec]
    order = rng.permutation(sum(pages_needed) + 2).astype(np.int32).tolist()
    head_scales = np.array([1e-2, 30.0], dtype=np.float32).repeat(d)  # heads of very different magnitude
    seqs, keys, values, at = [], [], [], 0
    hist_k, hist_v, new_k, new_v = [], [], [], []
    for (h, n), p in zip(spec, pages_needed):
        seqs.append((h, n, order[at:at + p]))
        at += p
        k = rng.standard_normal((h + n, kv_heads * d)).astype(np.float32) * head_scales
        v = rng.standard_normal((h + n, kv_heads * d)).astype(np.float32) * head_scales
        hist_k.append(k[:h]), hist_v.append(v[:h]), new_k.append(k[h:]), new_v.append(v[h:])
        keys.append(quantized(k, kv_heads, dtype)), values.append(quantized(v, kv_heads, dtype))
    rows = sum(n for _, n in spec)
    q = rng.standard_normal((rows, heads * 2 * d)).astype(np.float32)
    got = ops.attention(q, heads * 2 * d, 2 * d, np.concatenate(hist_k), np.concatenate(hist_v),
                        np.concatenate(new_k), np.concatenate(new_v), seqs, heads, kv_heads, d, d ** -0.5, dtype,
                        len(order), 2, 1)
    want = attention_reference(q, keys, values, [h for h, _ in spec], [n for _, n in spec], heads, kv_heads, d,
                               d ** -0.5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    if dtype == "f32":
        return
    # ... and the stored rows are really used: exact (f32) K/V give a different answer.
    exact = ops.attention(q, heads * 2 * d, 2 * d, np.concatenate(hist_k), np.concatenate(hist_v),
                          np.concatenate(new_k), np.concatenate(new_v), seqs, heads, kv_heads, d, d ** -0.5, "f32",
                          len(order), 2, 1)
    assert np.abs(exact - got).max() > (1e-5 if dtype == "bf16" else 1e-3) * np.abs(want).max()


# ---------- whole models ----------

def model_logits(artifact, kv_dtype: str, tokens: np.ndarray) -> np.ndarray:
    """Prefill the first 30 tokens (all logits), then decode the rest one at a time: both paths write and read KV."""
    model = _testing.Model.open(str(artifact), kv_dtype=kv_dtype, threads=2, max_context=512)
    seq = model.new_sequence()
    return np.concatenate([model.prefill(seq, tokens[:30], all_logits=True)] +
                          [model.decode(seq, int(t)) for t in tokens[30:]])


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def kv_errors(request, tiny_llama_artifact, tiny_qwen35_artifact) -> dict:
    """Max |logit - f32-KV logit| / logit scale per KV dtype, on 70 random tokens (crossing a 64-token page)."""
    artifact = tiny_llama_artifact if request.param == "llama" else tiny_qwen35_artifact
    vocab = _testing.Model.open(str(artifact), threads=1, max_context=128).config["vocab_size"]
    tokens = np.random.default_rng(5).integers(0, vocab, 70).astype(np.int32)
    exact = model_logits(artifact, "f32", tokens)
    scale = float(np.abs(exact).max())
    return {dtype: float(np.abs(model_logits(artifact, dtype, tokens) - exact).max()) / scale
            for dtype in ROUNDING_RATIO}


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_model_logits_with_8bit_kv_stay_within_their_rounding_bound(kv_errors, dtype):
    bound = ROOM * ROUNDING_RATIO[dtype] * kv_errors["bf16"]
    assert 0 < kv_errors["bf16"] < 2e-2  # the unit itself: bf16 within its parity bound, and not silently exact
    assert 0 < kv_errors[dtype] <= bound, f"{dtype}: {kv_errors}"


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_engine_generates_and_scores_with_8bit_kv(tiny_llama_artifact, dtype):
    """Through the engine API: score within the same bound as the logits (logprobs move by at most twice the
    logit error), and greedy generation runs to its length with KV pages freed after it."""
    tokens = np.random.default_rng(6).integers(0, 512, 80).tolist()
    scores = {}
    for kv_dtype in ("f32", "bf16", dtype):
        with Engine.open_sync(tiny_llama_artifact, EngineOptions(max_context=256, kv_dtype=kv_dtype)) as engine:
            scores[kv_dtype] = np.array(engine.score_sync(tokens))
            if kv_dtype == dtype:
                request = Request(tokens[:20], SamplingParams(temperature=0), max_new_tokens=50, stop_token_ids=())
                assert len(run_alone(engine, [request])[0]) == 50
                stats = engine.stats()
                assert stats.kv_free_tokens == stats.kv_capacity_tokens
    bf16_err = np.abs(scores["bf16"] - scores["f32"]).max()
    err = np.abs(scores[dtype] - scores["f32"]).max()
    assert 0 < err <= ROOM * ROUNDING_RATIO[dtype] * max(bf16_err, 1e-3), (err, bf16_err)


def test_cli_answers_with_fp8_kv(smollm2_cache_home):
    """`ninfer --kv-dtype fp8` on the embedded default model still answers the capital-of-France question."""
    ninfer = str(Path(sys.executable).parent / "ninfer")
    command = [ninfer, "--prompt", "What is the capital of France?", "--temperature", "0", "--max-new", "24",
               "--kv-dtype", "fp8"]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "XDG_CACHE_HOME": str(smollm2_cache_home)})
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
