"""What every pre-quantised Hugging Face layout reader (hf_int4.py, hf_gptq.py, hf_nvfp4.py) hands the safetensors
index: each quantised linear weight under its plain name `X.weight`, with its unpacked shape, the checkpoint tensors
it is read from, its dequantised values as the producer defines them, and how the artifact stores it.

The int4 layouts (compressed-tensors pack-quantized, GPTQ, AWQ) all come down to `GroupedInt4`: unsigned 4-bit codes,
and per (row, producer group) a scale and an unsigned zero point, `weight = (code - zero) * scale`, which is the
artifact's `int4` exactly when each artifact group of columns falls inside one producer group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ninfer.artifact.encodings import GROUP_SIZES, pack_nibbles
from ninfer.artifact.gguf_blocks import NativeTensor
from ninfer.errors import ConversionError

# Reads one checkpoint tensor by name (a torch tensor, as stored).
Read = Callable[[str], Any]


@dataclass(frozen=True)
class QuantizedWeight:
    """One pre-quantised weight: `shape` unpacked, `anchor` the checkpoint tensor whose file holds it, `parts` the
    checkpoint tensors it consumes (no other mapping may take them), `dequantized` its float32 values, `native` its
    artifact form."""

    shape: tuple[int, ...]
    anchor: str
    parts: frozenset[str]
    dequantized: Callable[[], np.ndarray]
    native: NativeTensor | None


class QuantizedLayout(Protocol):
    """A checkpoint's pre-quantisation scheme, read from its quantization config."""

    def weights(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], read: Read,
                folder: Path) -> dict[str, QuantizedWeight]:
        """Every quantised weight of the checkpoint by its plain name, each checked against the scheme."""
        ...


def unpack_int32_nibbles(words: np.ndarray, order: tuple[int, ...] = tuple(range(8))) -> np.ndarray:
    """Unsigned nibbles of int32 words along the last axis: word w's nibble at bits 4k..4k+3 is element
    8w + order[k] (order is the identity for GPTQ and compressed-tensors, AWQ's interleave for AWQ)."""
    words = np.ascontiguousarray(words).astype(np.uint32)
    out = np.empty(words.shape[:-1] + (words.shape[-1], 8), dtype=np.uint8)
    for k, element in enumerate(order):
        out[..., element] = (words >> np.uint32(4 * k)) & np.uint32(0xF)
    return out.reshape(words.shape[:-1] + (words.shape[-1] * 8,))


def int4_artifact_group(column_group: np.ndarray) -> int | None:
    """The largest artifact group size whose every aligned block of columns lies inside one producer group, or
    None (groups of 16, or GPTQ act-order groups that scatter the columns)."""
    cols = column_group.shape[0]
    for size in sorted(GROUP_SIZES, reverse=True):
        if cols % size == 0:
            blocks = column_group.reshape(-1, size)
            if (blocks == blocks[:, :1]).all():
                return size
    return None


class GroupedInt4:
    """An int4 weight as its producers define it: codes u8 [..., rows, cols] and, per (row, producer group), scales
    (float32, exactly as stored) and unsigned zero points u8; `column_group[c]` is column c's producer group."""

    def __init__(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, column_group: np.ndarray) -> None:
        self.codes = codes
        self.scale = scale
        self.zero = zero
        self.column_group = column_group

    def dequantized(self) -> np.ndarray:
        """(code - zero) * scale in float32 (each product of a 5-bit integer and a stored scale exact)."""
        zero = self.zero[..., self.column_group].astype(np.float32)
        return (self.codes.astype(np.float32) - zero) * self.scale[..., self.column_group]

    def blobs(self, group_size: int) -> dict[str, np.ndarray]:
        """int4 blobs with `group_size` (int4_artifact_group's): codes as they are, each artifact group taking the
        scale and zero point of the producer group it lies in."""
        first = self.column_group[::group_size]
        with np.errstate(over="ignore"):
            scale = self.scale[..., first].astype(np.float16)
        if not np.all(np.isfinite(scale)):
            raise ConversionError("int4 scales beyond f16's range (+-65504)")
        return {"q": pack_nibbles(self.codes), "scale": scale, "zero": self.zero[..., first]}


def native_int4(read: Callable[[], GroupedInt4], shape: tuple[int, ...], column_group: np.ndarray,
                scale_is_f16: bool) -> NativeTensor | None:
    """How an int4 weight is stored: its codes kept when the groups line up (exact with f16 scales; other scales are
    rounded to f16 and measured), else re-encoded from its dequantised values (measured); None when no group fits
    `cols` (the recipe decides, as for an unquantised weight). The re-encoding is int8: an artifact group then spans
    several producer grids, and int4 would add about as much error again as the producer's own rounding (7% relative
    on act-order GPTQ, against 0.5% for int8; tests/test_convert_gptq_awq.py)."""
    group = int4_artifact_group(column_group)
    if group is None:
        fallback = next((g for g in sorted(GROUP_SIZES, reverse=True) if shape[-1] % g == 0), None)
        return NativeTensor("int8", None, group_size=fallback) if fallback else None
    return NativeTensor("int4", lambda: read().blobs(group), exact=scale_is_f16, group_size=group)


def quantized_int4(shape: tuple[int, ...], anchor: str, parts: set[str], column_group: np.ndarray,
                   scale_dtype: str, read: Callable[[], GroupedInt4]) -> QuantizedWeight:
    """The QuantizedWeight of an int4 weight read by `read` (scales stored as safetensors dtype `scale_dtype`)."""
    return QuantizedWeight(shape, anchor, frozenset(parts), lambda: read().dequantized(),
                           native_int4(read, shape, column_group, scale_dtype == "F16"))
