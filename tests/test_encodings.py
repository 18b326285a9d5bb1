"""Quantizers and reference dequantizers: bit-exact scalar formats, per-encoding error bounds on fresh random
inputs, and the vectorised decoder against an obviously-right scalar decode of single elements."""

from __future__ import annotations

import itertools
import math
import os
import struct

import numpy as np
import pytest
import torch
from ninfer.artifact import encodings as enc
from ninfer.errors import ArtifactError, ConversionError

SEED = int.from_bytes(os.urandom(4), "little")
SHAPES = [(7, 128), (3, 5, 256), (1, 64), (33, 384)]


def fresh(shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    """Random weights with a spread of row scales and a few outliers, like real checkpoints."""
    rng = np.random.default_rng(SEED + salt)
    values = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 3.0, shape[:-1] + (1,))
    outliers = rng.random(shape) < 0.002
    values[outliers] *= 20
    return values.astype(np.float32)


# --- independent scalar definitions ----------------------------------------------------------------------


def e4m3_scalar(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 7
    if exponent == 0xF and mantissa == 7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e2m1_scalar(code: int) -> float:
    magnitude = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][code & 7]
    return -magnitude if code & 8 else magnitude


def nearest_code(value: float, decode, codes: range) -> int:
    """Round to nearest, ties to the even code, saturating: a brute-force search over every finite code."""
    candidates = [
        c
        for c in codes
        if not math.isnan(decode(c)) and math.copysign(1, decode(c)) == math.copysign(1, value)
    ]
    return min(candidates, key=lambda c: (abs(decode(c) - value), c & 1))


def f16_scalar(raw: bytes) -> float:
    return struct.unpack("<e", raw)[0]


def f32_scalar(raw: bytes) -> float:
    return struct.unpack("<f", raw)[0]


# --- scalar formats --------------------------------------------------------------------------------------


def test_e4m3_table_matches_the_scalar_definition():
    for code in range(256):
        expected, got = e4m3_scalar(code), float(enc.e4m3_to_f32(np.uint8(code)))
        assert (math.isnan(expected) and math.isnan(got)) or expected == got, code


def test_e4m3_rounding_matches_brute_force_including_ties():
    rng = np.random.default_rng(SEED)
    finite = [e4m3_scalar(c) for c in range(128) if not math.isnan(e4m3_scalar(c))]
    midpoints = [(a + b) / 2 for a, b in itertools.pairwise(finite)]
    values = np.concatenate(
        [
            rng.standard_normal(300) * 50,
            rng.standard_normal(100) * 0.01,
            np.array(midpoints),
            -np.array(midpoints),
            [500.0, -1e6, 448.0, 0.0, -0.0],
        ]
    )
    values = values.astype(np.float32)
    got = enc.f32_to_e4m3(values)
    for value, code in zip(values, got, strict=True):
        assert code == nearest_code(float(value), e4m3_scalar, range(256)), (float(value), int(code))


def test_e4m3_agrees_with_torch_in_range():
    values = np.clip(fresh((64, 256)) * 100, -448, 448)
    theirs = torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(enc.f32_to_e4m3(values), theirs)
    assert enc.f32_to_e4m3(np.array([np.nan], np.float32))[0] & 0x7F == 0x7F


def test_e2m1_rounding_matches_brute_force_including_ties():
    grid = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    midpoints = [(a + b) / 2 for a, b in itertools.pairwise(grid)]
    rng = np.random.default_rng(SEED)
    values = np.concatenate([rng.uniform(-8, 8, 300), midpoints, np.negative(midpoints), [7.0, -100.0]])
    values = values.astype(np.float32)
    for value, code in zip(values, enc.f32_to_e2m1(values), strict=True):
        assert code == nearest_code(float(value), e2m1_scalar, range(16)), (float(value), int(code))


def test_bf16_rounds_to_nearest_even_like_torch():
    values = np.concatenate([fresh((32, 128)).ravel(), np.array([np.inf, -np.inf, 3.3895314e38], np.float32)])
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(enc.f32_to_bf16_bits(values), theirs)
    nan_bits = enc.f32_to_bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(enc.bf16_bits_to_f32(nan_bits))[0]


# --- layouts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "shape", "group", "problem"),
    [
        ("int3", (4, 64), None, "unknown encoding"),
        ("int4", (4, 64), 16, "group_size 32, 64 or 128"),
        ("int4", (4, 96), 64, "multiple of group_size"),
        ("nvfp4", (4, 40), None, "multiple of 16"),
        ("fp8_e4m3", (64,), None, "needs a matrix"),
        ("bf16", (4, 0), None, "positive integers"),
        ("bf16", (4, 64), 32, "takes no group_size"),
    ],
)
def test_impossible_layouts_are_refused(encoding, shape, group, problem):
    assert problem in enc.encoding_problem(encoding, shape, group)
    with pytest.raises(ArtifactError, match=problem):
        enc.blob_specs(encoding, shape, group)


def test_blob_specs_sizes():
    specs = enc.blob_specs("int4", (8, 3, 256), 64)
    assert {k: (v.dtype.name, v.shape) for k, v in specs.items()} == {
        "q": ("uint8", (8, 3, 128)),
        "scale": ("float16", (8, 3, 4)),
        "zero": ("uint8", (8, 3, 4)),
    }
    assert specs["scale"].nbytes == 8 * 3 * 4 * 2
    nv = enc.blob_specs("nvfp4", (5, 64), None)
    assert (nv["q"].shape, nv["scale"].shape, nv["global_scale"].shape) == ((5, 32), (5, 4), (1,))


# --- error bounds ----------------------------------------------------------------------------------------

GROUPED_CASES = [("int8", 32), ("int8", 128), ("int4", 32), ("int4", 64), ("int4", 128)]


@pytest.mark.parametrize(
    ("encoding", "group", "shape"),
    [(e, g, shape) for shape in SHAPES for e, g in GROUPED_CASES if shape[-1] % g == 0],  # groups tile the rows
)
def test_int_error_is_at_most_half_a_step(encoding, group, shape):
    values = fresh(shape, salt=group)
    blobs = enc.encode(values, encoding, group)
    scale = np.repeat(blobs["scale"].astype(np.float32), group, axis=-1)
    error = np.abs(enc.decode(blobs, encoding, shape, group) - values)
    # What the encoding loses: rounding to the nearest step (the range always fits, the scale is rounded up).
    bound = scale / 2 * (1 + 1e-4) + np.abs(values) * 1e-6
    assert np.all(error <= bound), f"seed {SEED}: worst excess {np.max(error - bound)}"
    qmax = 255 if encoding == "int8" else 15
    assert blobs["zero"].max() <= qmax


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("shape", SHAPES)
def test_int4_affine_error_is_at_most_half_a_step(shape, group):
    if shape[-1] % group:
        pytest.skip("groups must tile the rows")
    values = fresh(shape, salt=group + 1)
    blobs = enc.encode(values, "int4_affine", group)
    scale = np.repeat(blobs["scale"].astype(np.float32), group, axis=-1)
    offset = np.repeat(blobs["offset"].astype(np.float32), group, axis=-1)
    error = np.abs(enc.decode(blobs, "int4_affine", shape, group) - values)
    # Rounding to the nearest step, plus the f16 rounding of the offset (the minimum) where it clips code 0.
    bound = scale / 2 * (1 + 1e-4) + np.abs(offset) * 2.0**-11 + np.abs(values) * 1e-6
    assert np.all(error <= bound), f"seed {SEED}: worst excess {np.max(error - bound)}"


@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_error_is_at_most_half_an_e4m3_ulp(shape):
    values = fresh(shape, salt=8)
    blobs = enc.encode(values, "fp8_e4m3", None)
    scale = blobs["scale"][..., None]
    scaled = np.abs(values) / scale
    # Half an ulp: 2^-4 relative in the normal range, half of the 2^-9 subnormal spacing below it.
    half_ulp = np.maximum(scaled * 2.0**-4, 2.0**-10)
    error = np.abs(enc.decode(blobs, "fp8_e4m3", shape, None) - values)
    bound = scale * half_ulp + np.abs(values) * 1e-6
    assert np.all(error <= bound), f"seed {SEED}: worst excess {np.max(error - bound)}"
    np.testing.assert_allclose(blobs["scale"], np.abs(values).max(axis=-1) / 448, rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_nvfp4_error_is_at_most_half_an_e2m1_step_times_block_scale(shape):
    values = fresh(shape, salt=4)
    blobs = enc.encode(values, "nvfp4", None)
    block = enc.e4m3_to_f32(blobs["scale"]) * blobs["global_scale"][0]
    step_scale = np.repeat(block, 16, axis=-1)
    scaled = np.abs(values) / step_scale
    # e2m1 spacing is 0.5 up to 2, 1 up to 4, 2 up to 6; beyond 6 (a block scale rounded down) it saturates,
    # and e4m3 rounding of the block scale keeps that overshoot below 6/16, inside the last half step.
    half_step = np.where(scaled <= 2, 0.25, np.where(scaled <= 4, 0.5, 1.0))
    error = np.abs(enc.decode(blobs, "nvfp4", shape, None) - values)
    bound = step_scale * half_step * (1 + 1e-5) + np.abs(values) * 1e-6
    assert np.all(error <= bound), f"seed {SEED}: worst excess {np.max(error - bound)}"
    np.testing.assert_allclose(blobs["global_scale"][0], np.abs(values).max() / (448 * 6), rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_plain_encodings_round_as_their_formats(shape):
    values = fresh(shape, salt=2)
    np.testing.assert_array_equal(enc.decode(enc.encode(values, "f32", None), "f32", shape, None), values)
    f16 = enc.decode(enc.encode(values, "f16", None), "f16", shape, None)
    np.testing.assert_array_equal(f16, torch.from_numpy(values).half().float().numpy())
    bf16 = enc.decode(enc.encode(values, "bf16", None), "bf16", shape, None)
    assert np.all(np.abs(bf16 - values) <= np.abs(values) * 2.0**-8)


def test_all_zero_groups_rows_and_blocks_decode_to_zero():
    values = np.zeros((3, 64), np.float32)
    for encoding, group in [("fp8_e4m3", None), ("int8", 32), ("int4", 64), ("int4_affine", 32), ("nvfp4", None)]:
        blobs = enc.encode(values, encoding, group)
        np.testing.assert_array_equal(enc.decode(blobs, encoding, values.shape, group), values)


@pytest.mark.parametrize("encoding", ["fp8_e4m3", "int8", "int4", "int4_affine", "nvfp4", "f16"])
def test_non_finite_or_unrepresentable_input_is_refused(encoding):
    values = fresh((4, 64))
    values[1, 3] = np.inf if encoding != "f16" else 1e6
    with pytest.raises(ConversionError, match=encoding):
        enc.encode(values, encoding, 32 if encoding in enc.GROUPED_ENCODINGS else None)


# --- chunking and the scalar decode ----------------------------------------------------------------------

ALL_CASES = [
    ("f32", None),
    ("f16", None),
    ("bf16", None),
    ("fp8_e4m3", None),
    ("int8", 64),
    ("int4", 32),
    ("int4_affine", 64),
    ("nvfp4", None),
]


@pytest.mark.parametrize(("encoding", "group"), ALL_CASES)
def test_row_chunks_do_not_change_the_result(encoding, group, monkeypatch):
    values = fresh((4, 9, 128), salt=5)
    whole = enc.encode(values, encoding, group)
    monkeypatch.setattr(enc, "_CHUNK_VALUES", 300)  # a few rows per chunk, with a ragged last one
    chunked = enc.encode(values, encoding, group)
    for name in whole:
        np.testing.assert_array_equal(whole[name], chunked[name])


def scalar_decode(
    raw: dict[str, bytes], encoding: str, shape: tuple[int, ...], group: int | None, index: tuple[int, ...]
) -> float:
    """One element straight from the blob bytes, following the format table line by line."""
    cols = shape[-1]
    row = 0
    for axis, i in enumerate(index[:-1]):
        row = row * shape[axis] + i
    col = index[-1]
    flat = row * cols + col
    if encoding == "f32":
        return f32_scalar(raw["data"][4 * flat : 4 * flat + 4])
    if encoding == "f16":
        return f16_scalar(raw["data"][2 * flat : 2 * flat + 2])
    if encoding == "bf16":
        return f32_scalar(b"\0\0" + raw["data"][2 * flat : 2 * flat + 2])
    if encoding == "fp8_e4m3":
        return e4m3_scalar(raw["q"][flat]) * f32_scalar(raw["scale"][4 * row : 4 * row + 4])
    if encoding in ("int8", "int4"):
        if encoding == "int8":
            q = raw["q"][flat]
        else:
            byte = raw["q"][row * cols // 2 + col // 2]
            q = byte & 0xF if col % 2 == 0 else byte >> 4
        g = row * (cols // group) + col // group
        return (q - raw["zero"][g]) * f16_scalar(raw["scale"][2 * g : 2 * g + 2])
    if encoding == "int4_affine":
        byte = raw["q"][row * cols // 2 + col // 2]
        q = byte & 0xF if col % 2 == 0 else byte >> 4
        g = row * (cols // group) + col // group
        return q * f16_scalar(raw["scale"][2 * g : 2 * g + 2]) + f16_scalar(raw["offset"][2 * g : 2 * g + 2])
    byte = raw["q"][row * cols // 2 + col // 2]
    code = byte & 0xF if col % 2 == 0 else byte >> 4
    block = raw["scale"][row * (cols // 16) + col // 16]
    return e2m1_scalar(code) * e4m3_scalar(block) * f32_scalar(raw["global_scale"])


@pytest.mark.parametrize(("encoding", "group"), ALL_CASES)
def test_decoder_matches_scalar_decode(encoding, group):
    shape = (3, 5, 128)
    values = fresh(shape, salt=7)
    blobs = enc.encode(values, encoding, group)
    decoded = enc.decode(blobs, encoding, shape, group)
    raw = {name: blob.tobytes() for name, blob in blobs.items()}
    rng = np.random.default_rng(SEED)
    for _ in range(40):
        index = tuple(int(rng.integers(0, d)) for d in shape)
        expected = scalar_decode(raw, encoding, shape, group, index)
        assert decoded[index] == pytest.approx(expected, rel=1e-6, abs=0), (index, SEED)
