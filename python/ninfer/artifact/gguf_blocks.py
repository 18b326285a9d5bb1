"""GGUF quantised blocks -> artifact encodings, without re-quantising where a block format is an encoding.

Q4_0, Q4_1 and Q8_0 are groups of 32 columns with an f16 scale (and, for Q4_1, an f16 minimum), which the
grouped encodings hold exactly: Q4_0 = int4 g32 with zero point 8, Q4_1 = int4_affine g32, Q8_0 = int8 g32 with
zero point 128 (the signed code plus 128). Their blobs are rearranged from the blocks, never computed from floats.
The K-quants (256-column super-blocks of 16- or 32-column sub-blocks with 6- or 8-bit sub-scales) have no such
counterpart: they map to the encoding with no fewer bits that they are re-encoded into (from gguf's
dequantised floats), and the converter prints the error that adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

BLOCK = 32
_EXACT = {"Q4_0": "int4", "Q4_1": "int4_affine", "Q8_0": "int8"}
# Bits of each K-quant's codes -> the grouped encoding that holds at least as many.
_FLOOR = {"Q2_K": "int4", "Q3_K": "int4", "Q4_K": "int8", "Q5_K": "int8", "Q6_K": "int8"}


class NativeTensor:
    """How a quantised GGUF tensor is stored in the artifact: its encoding (group 32) and, when exact, a loader
    of its blobs (None: encode gguf's dequantised floats, and report the error)."""

    def __init__(self, encoding: str, blobs: Callable[[], dict[str, np.ndarray]] | None) -> None:
        self.encoding = encoding
        self.group_size = BLOCK
        self.blobs = blobs

    @property
    def exact(self) -> bool:
        return self.blobs is not None


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


def _q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    b = _blocks(raw, shape, 34)
    groups = shape[:-1] + (shape[-1] // BLOCK,)
    codes = (b.rest.view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return {"q": codes.reshape(shape), "scale": b.scale.reshape(groups),
            "zero": np.full(groups, 128, dtype=np.uint8)}


_UNPACK = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0}


def native_tensor(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> NativeTensor | None:
    """The artifact form of a GGUF tensor of `type_name` and row-major `shape`, or None for float types (which
    follow the recipe) and block types with no mapping here."""
    if len(shape) >= 2 and shape[-1] % BLOCK == 0 and type_name in _EXACT:
        unpack = _UNPACK[type_name]
        return NativeTensor(_EXACT[type_name], lambda: unpack(raw, shape))
    if len(shape) >= 2 and shape[-1] % BLOCK == 0 and type_name in _FLOOR:
        return NativeTensor(_FLOOR[type_name], None)
    return None
