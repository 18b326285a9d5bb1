"""8-bit KV rows (fp8 e4m3 / int8 with one scale per (token, head) row) within the bound of their own rounding."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer import _engine, errors


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
        got = np.array(_engine.kv_quant_roundtrip(x.tolist(), "int8"), dtype=np.float32)
        step = np.abs(x).max() / 127
        assert np.all(np.abs(got - x) <= step / 2 * (1 + 1e-5) + 1e-30)


def test_fp8_rows_keep_three_mantissa_bits():
    rng = np.random.default_rng()
    for x in rows(rng):
        got = np.array(_engine.kv_quant_roundtrip(x.tolist(), "fp8"), dtype=np.float32)
        scale = np.abs(x).max() / 448
        # e4m3: relative error 2^-4 for normal values, absolute 2^-10 * scale in the subnormal range.
        bound = np.maximum(np.abs(x) * 2.0**-4, 2.0**-10 * scale) * (1 + 1e-5)
        assert np.all(np.abs(got - x) <= bound + 1e-30)
        assert np.abs(got).max() == pytest.approx(np.abs(x).max(), rel=1e-6)  # the largest value is exact


def test_other_dtypes_are_not_row_formats():
    with pytest.raises(errors.EngineError, match="not an 8-bit row format"):
        _engine.kv_quant_roundtrip([1.0, 2.0], "bf16")
