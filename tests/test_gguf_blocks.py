"""GGUF 32-column block types against gguf-py, llama.cpp's own Python package: blocks its quantiser writes from
fresh random weights, imported without re-quantising, decode to exactly the values its dequantiser gives (Q4_0,
Q4_1, Q5_0, Q8_0); Q5_1, which no encoding holds exactly, goes to the re-encoding path at no fewer bits."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from ninfer.artifact.encodings import decode
from ninfer.artifact.gguf_blocks import native_tensor

SHAPE = (48, 256)


def _weights() -> np.ndarray:
    rng = np.random.default_rng()
    # Rows of different magnitudes, and a few blocks of zeros and of one sign (the quantisers' edge cases).
    w = rng.standard_normal(SHAPE).astype(np.float32) * np.exp2(rng.integers(-8, 4, (SHAPE[0], 1)))
    w[0, :32] = 0.0
    w[1, 32:64] = np.abs(w[1, 32:64])
    return w


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q8_0"])
def test_exact_block_types_decode_to_gguf_py_values(type_name):
    qtype = GGMLQuantizationType[type_name]
    raw = quants.quantize(_weights(), qtype)
    native = native_tensor(type_name, raw, SHAPE)
    assert native is not None and native.exact and native.group_size == 32
    ours = decode(native.blobs(), native.encoding, SHAPE, native.group_size)
    np.testing.assert_array_equal(ours, np.asarray(quants.dequantize(raw, qtype), dtype=np.float32))


def test_q5_1_is_re_encoded_at_no_fewer_bits():
    raw = quants.quantize(_weights(), GGMLQuantizationType.Q5_1)
    native = native_tensor("Q5_1", raw, SHAPE)
    assert native is not None and (native.encoding, native.blobs, native.exact) == ("int8", None, False)
