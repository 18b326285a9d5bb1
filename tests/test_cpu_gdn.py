"""The Gated DeltaNet CPU kernels (`_testing.gdn`, qwen35-architecture.md section 4) on fresh random
inputs: the causal conv against a direct numpy transcription of section 4.2 (and HF's torch
`causal_conv1d_update`), the recurrent delta rule against a float64 transcription of the section 4.5
pseudo-code and against HF transformers' own torch fallbacks, and the chunked (WY) form against the recurrent
one for every length / chunk combination.

The binding fills every fresh output with NaN before the kernel runs: an element a kernel skips cannot pass.

Tolerances: every check is `max|actual - expected| <= RTOL * max|expected|`. The kernels compute in fp32; each
output is a sum of Dk-long dot products over a state that is itself a decayed sum of per-token updates
(|k| = 1, beta < 1, so the state stays bounded), so the fp32 rounding error stays within a few hundred ulps of
the largest value. Observed errors are 1e-7 to 1.3e-6 relative; RTOL = 1e-5 leaves headroom, while a wrong
decay order, a missing term or an off-by-one at a chunk boundary gives errors of order 1e-2 or more (reading
the state before the update, or grouping heads as j % Hk, gives ~1).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import torch
from ninfer import _testing
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

RTOL = 1e-5
SEED = int.from_bytes(os.urandom(4), "little")


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A fresh generator per test; the seed is in the test's report so a failure can be replayed."""
    seed = SEED ^ zlib.crc32(request.node.name.encode())
    request.node.user_properties.append(("seed", seed))
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.isfinite(actual).all(), f"{what}: non-finite values (an unwritten output stays NaN)"
    scale = float(np.abs(expected).max()) or 1.0
    err = float(np.abs(actual.astype(np.float64) - expected).max()) / scale
    assert err <= RTOL, f"{what}: max error {err:.3g} of max|expected| {scale:.3g} exceeds {RTOL}"


# ----------------------------------------------------------------------------------------------------
# Causal conv (section 4.2)


def conv_reference(mixed: np.ndarray, weight: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u[t, c] = silu(sum_j w[c, j] x[t - (K-1) + j, c]) over [history | mixed], in float64."""
    K = weight.shape[1]
    x = np.concatenate([state.T, mixed]).astype(np.float64)  # [K-1+T, C]
    T = mixed.shape[0]
    conv = sum(weight[:, j].astype(np.float64) * x[j:j + T] for j in range(K))
    return conv / (1.0 + np.exp(-conv)), x[T:].T.copy()


def conv_inputs(rng: np.random.Generator, T: int, C: int, K: int, history: bool):
    mixed = rng.standard_normal((T, C)).astype(np.float32)
    weight = (rng.standard_normal((C, K)) / np.sqrt(K)).astype(np.float32)
    state = (rng.standard_normal((C, K - 1)) if history else np.zeros((C, K - 1))).astype(np.float32)
    return mixed, weight, state


@pytest.mark.parametrize("history", [False, True], ids=["fresh", "carried"])
@pytest.mark.parametrize(
    ("T", "C", "K"), [(1, 8, 4), (2, 70, 4), (3, 130, 4), (37, 200, 4), (9, 33, 2), (5, 20, 1)]
)
def test_conv_matches_reference(rng: np.random.Generator, T: int, C: int, K: int, history: bool) -> None:
    mixed, weight, state = conv_inputs(rng, T, C, K, history)
    out, new_state = _testing.gdn.causal_conv(mixed, weight, state)
    ref_out, ref_state = conv_reference(mixed, weight, state)
    assert_close(out, ref_out, "conv output")
    # The state holds raw inputs, copied: exact.
    np.testing.assert_array_equal(new_state, ref_state.astype(np.float32))


def test_conv_matches_hf_update(rng: np.random.Generator) -> None:
    mixed, weight, state = conv_inputs(rng, 11, 96, 4, history=True)
    hf_state = torch.from_numpy(state.copy())[None]  # [B, C, K-1], updated in place by HF
    hf_mixed = torch.from_numpy(mixed.T.copy())[None]  # [B, C, T]
    hf_out = hf.causal_conv1d_update(hf_mixed, hf_state, torch.from_numpy(weight), None, "silu")
    out, new_state = _testing.gdn.causal_conv(mixed, weight, state)
    assert_close(out, hf_out[0].T.numpy().astype(np.float64), "conv vs HF causal_conv1d_update")
    np.testing.assert_array_equal(new_state, hf_state[0].numpy())


def test_conv_single_steps_equal_prefill(rng: np.random.Generator) -> None:
    mixed, weight, state = conv_inputs(rng, 9, 130, 4, history=True)
    prefill, prefill_state = _testing.gdn.causal_conv(mixed, weight, state)
    for t in range(mixed.shape[0]):
        step, state = _testing.gdn.causal_conv(mixed[t:t + 1], weight, state)
        assert_close(step[0], prefill[t].astype(np.float64), f"decode step {t}")
    np.testing.assert_array_equal(state, prefill_state)


# ----------------------------------------------------------------------------------------------------
# Gated delta rule (sections 4.3 - 4.5)


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Section 4.4: x * rsqrt(sum x^2 + 1e-6), per head."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def delta_rule_inputs(rng: np.random.Generator, T: int, Hk: int, Hv: int, Dk: int, Dv: int):
    """Raw (unnormalised) q, k as the conv emits them, and g, beta from the section 4.3 gate formulas with
    A_log / dt_bias spread so that per-token decays range from ~1 down to ~e^-15."""
    q_raw = rng.standard_normal((T, Hk, Dk)).astype(np.float32)
    k_raw = rng.standard_normal((T, Hk, Dk)).astype(np.float32)
    v = rng.standard_normal((T, Hv, Dv)).astype(np.float32)
    a_log = rng.uniform(-3.0, 1.5, Hv)
    dt_bias = rng.standard_normal(Hv)
    a = rng.standard_normal((T, Hv))
    g = (-np.exp(a_log) * np.logaddexp(0.0, a + dt_bias)).astype(np.float32)
    beta = (1.0 / (1.0 + np.exp(-2.0 * rng.standard_normal((T, Hv))))).astype(np.float32)
    state = (rng.standard_normal((Hv, Dk, Dv)) * 0.5).astype(np.float32)
    return q_raw, k_raw, v, g, beta, state


def kernel_qk(q_raw: np.ndarray, k_raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the kernels take: L2-normalised q and k, q also scaled by Dk^-0.5."""
    Dk = q_raw.shape[-1]
    return (l2_normalise(q_raw) * Dk**-0.5).astype(np.float32), l2_normalise(k_raw).astype(np.float32)


def delta_rule_reference(q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
    """Section 4.5 token by token, float64; value head j reads key head j // (Hv / Hk)."""
    T, Hk, _ = q.shape
    Hv = v.shape[1]
    S = state.astype(np.float64).copy()
    out = np.zeros(v.shape)
    for t in range(T):
        for j in range(Hv):
            h = j // (Hv // Hk)
            kt, qt = k[t, h].astype(np.float64), q[t, h].astype(np.float64)
            S[j] *= np.exp(np.float64(g[t, j]))               # decay first
            p = S[j].T @ kt                                   # prediction from the decayed state
            delta = np.float64(beta[t, j]) * (v[t, j] - p)
            S[j] += np.outer(kt, delta)
            out[t, j] = S[j].T @ qt                           # read after the update
    return out, S


SHAPES = [(2, 4, 16, 24), (1, 3, 8, 8), (2, 2, 32, 16)]  # (Hk, Hv, Dk, Dv): grouped, odd group, one-to-one


@pytest.mark.parametrize(("Hk", "Hv", "Dk", "Dv"), SHAPES)
@pytest.mark.parametrize("kernel", ["recurrent", "chunked"])
def test_delta_rule_matches_section_4_5(rng: np.random.Generator, kernel: str, Hk: int, Hv: int, Dk: int,
                                        Dv: int) -> None:
    q_raw, k_raw, v, g, beta, state = delta_rule_inputs(rng, 45, Hk, Hv, Dk, Dv)
    q, k = kernel_qk(q_raw, k_raw)
    args = (q, k, v, g, beta, state) + ((16,) if kernel == "chunked" else ())
    out, new_state = getattr(_testing.gdn, kernel)(*args)
    ref_out, ref_state = delta_rule_reference(q, k, v, g, beta, state)
    assert_close(out, ref_out, f"{kernel} output")
    assert_close(new_state, ref_state, f"{kernel} state")


@pytest.mark.parametrize(("hf_name", "T"), [("torch_recurrent_gated_delta_rule", 1),
                                             ("torch_recurrent_gated_delta_rule", 33),
                                             ("torch_chunk_gated_delta_rule", 100)])
@pytest.mark.parametrize("kernel", ["recurrent", "chunked"])
def test_delta_rule_matches_hf(rng: np.random.Generator, kernel: str, hf_name: str, T: int) -> None:
    """HF's torch fallbacks take [B, T, H, D] q/k/v, [B, T, Hv] g/beta and a [B, Hv, Dk, Dv] state; with
    use_qk_l2norm_in_kernel they L2-normalise q, k themselves, and they always scale q by Dk^-0.5. Given
    Hk < Hv key heads they repeat_interleave them to Hv (transformers 5.23 does this inside the function,
    as the model's layer passes Hk heads) — the j // (Hv / Hk) grouping the kernels apply by index."""
    Hk, Hv, Dk, Dv = 2, 6, 32, 16
    q_raw, k_raw, v, g, beta, state = delta_rule_inputs(rng, T, Hk, Hv, Dk, Dv)
    batch = [torch.from_numpy(x.copy())[None] for x in (q_raw, k_raw, v, g, beta, state)]
    hf_out, hf_state = getattr(hf, hf_name)(*batch[:5], initial_state=batch[5], output_final_state=True,
                                            use_qk_l2norm_in_kernel=True)
    q, k = kernel_qk(q_raw, k_raw)
    args = (q, k, v, g, beta, state) + ((64,) if kernel == "chunked" else ())
    out, new_state = getattr(_testing.gdn, kernel)(*args)
    assert_close(out, hf_out[0].numpy().astype(np.float64), f"{kernel} vs HF {hf_name} output")
    assert_close(new_state, hf_state[0].numpy().astype(np.float64), f"{kernel} vs HF {hf_name} state")


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 200])
def test_chunked_equals_recurrent(rng: np.random.Generator, T: int, chunk: int) -> None:
    q_raw, k_raw, v, g, beta, state = delta_rule_inputs(rng, T, 2, 4, 16, 24)
    q, k = kernel_qk(q_raw, k_raw)
    out, new_state = _testing.gdn.chunked(q, k, v, g, beta, state, chunk)
    ref_out, ref_state = _testing.gdn.recurrent(q, k, v, g, beta, state)
    assert_close(out, ref_out.astype(np.float64), "chunked output")
    assert_close(new_state, ref_state.astype(np.float64), "chunked state")


def test_chunked_equals_recurrent_at_model_size(rng: np.random.Generator) -> None:
    """The 4B/9B head sizes (Dk = Dv = 128, 2 value heads per key head): full register tiles everywhere."""
    q_raw, k_raw, v, g, beta, state = delta_rule_inputs(rng, 150, 2, 4, 128, 128)
    q, k = kernel_qk(q_raw, k_raw)
    out, new_state = _testing.gdn.chunked(q, k, v, g, beta, state)
    ref_out, ref_state = _testing.gdn.recurrent(q, k, v, g, beta, state)
    assert_close(out, ref_out.astype(np.float64), "chunked output")
    assert_close(new_state, ref_state.astype(np.float64), "chunked state")


@pytest.mark.parametrize(
    ("kernel", "split"), [("recurrent", 77), ("chunked", 77), ("chunked", 64), ("chunked", 1)]
)
def test_split_calls_equal_one_call(rng: np.random.Generator, kernel: str, split: int) -> None:
    """A prefill cut in two (state carried between the calls) gives the one-call result."""
    q_raw, k_raw, v, g, beta, state = delta_rule_inputs(rng, 200, 2, 4, 16, 24)
    q, k = kernel_qk(q_raw, k_raw)
    run = getattr(_testing.gdn, kernel)
    whole_out, whole_state = run(q, k, v, g, beta, state)
    head = (x[:split] for x in (q, k, v, g, beta))
    tail = (x[split:] for x in (q, k, v, g, beta))
    first_out, mid_state = run(*head, state)
    second_out, end_state = run(*tail, mid_state)
    assert_close(np.concatenate([first_out, second_out]), whole_out.astype(np.float64), "split output")
    assert_close(end_state, whole_state.astype(np.float64), "split state")


def test_bad_shapes_are_refused() -> None:
    q = np.zeros((3, 2, 8), np.float32)
    v = np.zeros((3, 3, 8), np.float32)  # 3 value heads over 2 key heads
    gb = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="multiple of key heads"):
        _testing.gdn.recurrent(q, q, v, gb, gb, np.zeros((3, 8, 8), np.float32))
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        _testing.gdn.chunked(q, q, np.zeros((3, 4, 8), np.float32), np.zeros((3, 4), np.float32),
                            np.zeros((3, 4), np.float32), np.zeros((4, 8, 8), np.float32), 0)
    with pytest.raises(ValueError, match="state must be"):
        _testing.gdn.causal_conv(np.zeros((2, 4), np.float32), np.zeros((4, 3), np.float32),
                                np.zeros((4, 3), np.float32))
