"""GGUF quantised blocks -> artifact encodings, without re-quantising where a block format is an encoding.

Q4_0, Q4_1, Q5_0 and Q8_0 are groups of 32 columns with an f16 scale (and, for Q4_1, an f16 minimum), which the
grouped encodings hold exactly: Q4_0 = int4 g32 with zero point 8, Q4_1 = int4_affine g32, Q5_0 = int8 g32 with
zero point 16 (its 5-bit codes, the fifth bit from the block's qh word), Q8_0 = int8 g32 with zero point 128 (the
signed code plus 128). Their blobs are rearranged from the blocks, never computed from floats. Q5_1 (5-bit codes,
a scale and an f16 minimum) has no exact form (int8's zero point is an integer): it is re-encoded as int8 g32.
Q4_K's 32-column sub-blocks are `d * sc * q - dmin * m` (f16 super-block scales times 6-bit sub-scales, 4-bit
codes): int4_affine g32 holds them with its scale and offset rounded to f16 (the codes are kept), so they are
rearranged too, not exact: the converter prints the error. The other K-quants and the I-quants (16-column
sub-blocks, 5- and 6-bit codes, non-linear grids) have no counterpart: they map to the encoding with no fewer bits
that they are re-encoded into (from gguf's dequantised floats), and the converter prints the error that adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

BLOCK = 32
_EXACT = {"Q4_0": "int4", "Q4_1": "int4_affine", "Q5_0": "int8", "Q8_0": "int8"}
# Bits of each other block type's codes -> the grouped encoding that holds at least as many.
_FLOOR = {"Q5_1": "int8", "Q2_K": "int4", "Q3_K": "int4", "Q5_K": "int8", "Q6_K": "int8",
          "IQ1_S": "int4", "IQ1_M": "int4", "IQ2_XXS": "int4", "IQ2_XS": "int4", "IQ2_S": "int4", "IQ3_XXS": "int4",
          "IQ3_S": "int4", "IQ4_NL": "int8", "IQ4_XS": "int8"}
K_BLOCK = 256


class NativeTensor:
    """How a pre-quantised tensor (GGUF blocks, hf_int4.py's packed int4) is stored in the artifact: its encoding
    and group size (32 for GGUF) and a loader of its blobs rearranged from the source (None: encode the dequantised floats). `exact`: the blobs hold exactly the
    dequantised values; otherwise the converter measures and prints their error."""

    def __init__(self, encoding: str, blobs: Callable[[], dict[str, np.ndarray]] | None, exact: bool = True,
                 group_size: int = BLOCK) -> None:
        self.encoding = encoding
        self.group_size = group_size
        self.blobs = blobs
        self.exact = exact and blobs is not None


class _Blocks(NamedTuple):
    scale: np.ndarray  # f16 [rows, groups]
    rest: np.ndarray  # u8 [rows, groups, bytes after the scale]


def _blocks(raw: np.ndarray, shape: tuple[int, ...], block_bytes: int) -> _Blocks:
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, shape[-1] // BLOCK, block_bytes)
    scale = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
    return _Blocks(scale, blocks[..., 2:])


def _codes_q4(qs: np.ndarray) -> np.ndarray:
    """A Q4 block's 32 codes in column order: byte j holds column j (low nibble) and column j + 16 (high)."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _pack(codes: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Column-ordered 4-bit codes [rows, groups, 32] -> the artifact's nibble packing (low nibble = even column)."""
    flat = codes.reshape(-1, shape[-1])
    return (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8).reshape(shape[:-1] + (shape[-1] // 2,))


def _q4_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    b = _blocks(raw, shape, 18)
    groups = shape[:-1] + (shape[-1] // BLOCK,)
    return {"q": _pack(_codes_q4(b.rest), shape), "scale": b.scale.reshape(groups),
            "zero": np.full(groups, 8, dtype=np.uint8)}


def _q4_1(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    b = _blocks(raw, shape, 20)
    groups = shape[:-1] + (shape[-1] // BLOCK,)
    offset = np.ascontiguousarray(b.rest[..., :2]).view(np.float16)[..., 0]
    return {"q": _pack(_codes_q4(b.rest[..., 2:]), shape), "scale": b.scale.reshape(groups),
            "offset": offset.reshape(groups)}


def _q5_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Q5_0 blocks (f16 d, a little-endian u32 qh, 16 bytes qs): column j < 16 is qs[j] & 0xF with bit j of qh as
    its fifth bit, column j + 16 is qs[j] >> 4 with bit j + 16; the value is d * (code - 16)."""
    b = _blocks(raw, shape, 22)
    groups = shape[:-1] + (shape[-1] // BLOCK,)
    qh = np.ascontiguousarray(b.rest[..., :4]).view("<u4")  # [rows, groups, 1]
    high = ((qh >> np.arange(BLOCK, dtype=np.uint32)) & 1).astype(np.uint8) << 4  # [rows, groups, 32]
    codes = _codes_q4(b.rest[..., 4:]) | high
    return {"q": codes.reshape(shape), "scale": b.scale.reshape(groups),
            "zero": np.full(groups, 16, dtype=np.uint8)}


def _q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    b = _blocks(raw, shape, 34)
    groups = shape[:-1] + (shape[-1] // BLOCK,)
    codes = (b.rest.view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return {"q": codes.reshape(shape), "scale": b.scale.reshape(groups),
            "zero": np.full(groups, 128, dtype=np.uint8)}


def _q4_k_sub_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit sub-block scales and minimums of Q4_K's 12 scale bytes: bytes 0-3 hold scales 0-3 (low 6
    bits), bytes 4-7 minimums 0-3; scales and minimums 4-7 have their low 4 bits in bytes 8-11 (scale: low nibble,
    minimum: high nibble) and their top 2 bits in the top bits of bytes 0-3 (scales) and 4-7 (minimums)."""
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([low & 0x3F, (rest & 0x0F) | ((low >> 6) << 4)], axis=-1)
    minimums = np.concatenate([high & 0x3F, (rest >> 4) | ((high >> 6) << 4)], axis=-1)
    return scales, minimums


def _q4_k(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, shape[-1] // K_BLOCK, 144)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16).astype(np.float32)
    dmin = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16).astype(np.float32)
    sub_scale, sub_min = _q4_k_sub_scales(blocks[..., 4:16])
    # 128 code bytes = 4 chunks of 32 bytes; chunk c holds sub-block 2c in its low nibbles, 2c + 1 in its high.
    qs = blocks[..., 16:].reshape(rows, -1, 4, 1, 32)
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=3)  # [rows, blocks, chunk, half, 32] = column order
    groups = shape[:-1] + (shape[-1] // BLOCK,)
    return {"q": _pack(codes, shape),
            "scale": (d * sub_scale).astype(np.float16).reshape(groups),
            "offset": (-(dmin * sub_min)).astype(np.float16).reshape(groups)}


_UNPACK = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q8_0": _q8_0}


def native_tensor(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> NativeTensor | None:
    """The artifact form of a GGUF tensor of `type_name` and row-major `shape`, or None for float types (which
    follow the recipe) and block types with no mapping here."""
    if len(shape) >= 2 and shape[-1] % BLOCK == 0 and type_name in _EXACT:
        unpack = _UNPACK[type_name]
        return NativeTensor(_EXACT[type_name], lambda: unpack(raw, shape))
    if len(shape) >= 2 and shape[-1] % K_BLOCK == 0 and type_name == "Q4_K":
        return NativeTensor("int4_affine", lambda: _q4_k(raw, shape), exact=False)
    if len(shape) >= 2 and shape[-1] % BLOCK == 0 and type_name in _FLOOR:
        return NativeTensor(_FLOOR[type_name], None)
    return None
