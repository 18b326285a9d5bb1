"""compressed-tensors `pack-quantized` int4 checkpoints -> the artifact's `int4` encoding, without re-quantising.

The producer (the `compressed-tensors` package, what llm-compressor saves) replaces a linear `X.weight [rows, cols]`
with `X.weight_packed` (int32 [rows, cols / 8]: column c in bits 4c..4c+3 of its word, little-endian, as `q + 8`
for a signed code q in [-8, 7]), `X.weight_scale` [rows, cols / group] in the model's dtype, `X.weight_shape`, and,
when asymmetric, `X.weight_zero_point` (signed int4 in [-8, 7], packed the same way along the rows). Its weight is
`(q - zero) * scale`. The artifact's int4 is `(code - zero) * scale` with the same nibble order, u8 zero points and
f16 scales: the codes are the packed bytes as they are and the zero points shift by 8, so a tensor is held exactly
when its groups line up (the producer's group a multiple of 32, 64 or 128 and of nothing coarser than `cols`; a
per-channel scale is one group of `cols`, repeated) and its scales are f16 values (f16 ones always; bf16 ones inside
f16's range). Otherwise the codes are kept with the scales rounded to f16, or (groups that do not line up) the
weight is re-encoded from its dequantised values; the converter prints the error either adds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ninfer.artifact.encodings import GROUP_SIZES
from ninfer.artifact.gguf_blocks import NativeTensor
from ninfer.errors import ConversionError

PACKED_SUFFIX = "_packed"  # `X.weight_packed` packs `X.weight`
_PARTS = ("_packed", "_scale", "_zero_point", "_shape")
_CODE_OFFSET = 8  # the producer stores a signed int4 code q as the nibble q + 8


class PackedInt4:
    """The pack-quantized scheme of a checkpoint: group size (None: one scale per row) and symmetry."""

    def __init__(self, group_size: int | None, symmetric: bool) -> None:
        self.group_size = group_size
        self.symmetric = symmetric

    def artifact_group(self, cols: int) -> int | None:
        """The largest artifact group size that divides both the producer's groups and `cols`, or None."""
        producer = self.group_size or cols
        return next((g for g in sorted(GROUP_SIZES, reverse=True) if producer % g == 0 and cols % g == 0), None)


def packed_int4_scheme(quantization: dict, folder: Path) -> PackedInt4:
    """The scheme of a compressed-tensors quantization_config, refused by name unless every config group is int4
    weight-only pack-quantized with group or channel scales (activation quantisation would change the model)."""
    groups = quantization.get("config_groups") or {}
    schemes = set()
    for name, group in groups.items():
        weights = group.get("weights") or {}
        supported = ((group.get("format") or quantization.get("format")) == "pack-quantized"
                     and weights.get("num_bits") == 4 and weights.get("type") == "int"
                     and weights.get("strategy") in ("group", "channel") and not weights.get("actorder")
                     and not group.get("input_activations") and not group.get("output_activations"))
        if not supported:
            raise ConversionError(f"{folder}: compressed-tensors config group {name!r} ({json.dumps(group)}) is not "
                                  "supported (int4 weight-only pack-quantized, group or channel strategy, no actorder, "
                                  "is)")
        size = weights.get("group_size") if weights["strategy"] == "group" else None
        schemes.add((size, bool(weights.get("symmetric", True))))
    if len(schemes) != 1:
        raise ConversionError(f"{folder}: compressed-tensors config groups {sorted(groups)} use {len(schemes)} "
                              "different int4 schemes; one scheme for every group is supported")
    size, symmetric = schemes.pop()
    if size is not None and (not isinstance(size, int) or size < 1):
        raise ConversionError(f"{folder}: compressed-tensors group_size {size!r} is not a positive integer")
    return PackedInt4(size, symmetric)


def packed_weights(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], scheme: PackedInt4,
                   folder: Path) -> list[str]:
    """The packed weights (`X.weight` of each `X.weight_packed`), checking that each has its other parts."""
    found = []
    for name in sorted(shapes):
        if not name.endswith(PACKED_SUFFIX):
            continue
        prefix = name[: -len(PACKED_SUFFIX)]
        needed = ["_scale", "_shape"] + ([] if scheme.symmetric else ["_zero_point"])
        missing = [prefix + part for part in needed if prefix + part not in shapes]
        if missing:
            raise ConversionError(f"{folder}: {name} lacks {', '.join(missing)}")
        if dtypes[name] != "I32":
            raise ConversionError(f"{folder}: {name} is {dtypes[name]}; pack-quantized int4 is packed in I32")
        found.append(prefix)
    return found


def check_parts(weight: str, shape: tuple[int, ...], shapes: dict[str, tuple[int, ...]], scheme: PackedInt4,
                folder: Path) -> None:
    """The packed codes, scales and zero points of `weight` (unpacked `shape`) must have the scheme's shapes."""
    if len(shape) < 2:
        raise ConversionError(f"{folder}: {weight}_shape {list(shape)} is not a matrix")
    lead, rows, cols = shape[:-2], shape[-2], shape[-1]
    groups = -(-cols // scheme.group_size) if scheme.group_size else 1
    expected = {"_packed": (*lead, rows, -(-cols // 8)), "_scale": (*lead, rows, groups)}
    if not scheme.symmetric:
        expected["_zero_point"] = (*lead, -(-rows // 8), groups)
    scales = f"groups of {scheme.group_size}" if scheme.group_size else "one scale per row"
    for part, want in expected.items():
        if tuple(shapes[weight + part]) != want:
            raise ConversionError(f"{folder}: {weight}{part} has shape {list(shapes[weight + part])}; int4 "
                                  f"{list(shape)} with {scales} needs {list(want)}")


def consumed_names(prefix: str) -> list[str]:
    return [prefix + part for part in _PARTS]


def _codes(packed: np.ndarray) -> np.ndarray:
    """The artifact's int4 bytes of a packed int32 array: its little-endian bytes, nibbles already in column order."""
    return np.ascontiguousarray(packed, dtype="<i4").view(np.uint8)


def _unpack(packed: np.ndarray) -> np.ndarray:
    """Unsigned nibbles (code + 8) of a packed int32 array, column order along its last axis."""
    raw = _codes(packed)
    out = np.empty(raw.shape[:-1] + (raw.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2], out[..., 1::2] = raw & 0xF, raw >> 4
    return out


class PackedTensor:
    """One pack-quantized weight's tensors (numpy; scales as float32, exactly as stored), its unpacked shape and
    the columns each scale covers (the last group possibly partial)."""

    def __init__(self, shape: tuple[int, ...], group_size: int, packed: np.ndarray, scale: np.ndarray,
                 zero_point: np.ndarray | None) -> None:
        self.shape = shape
        self.group_size = group_size
        self.packed = packed
        self.scale = scale
        if zero_point is None:
            self.zero = np.full(scale.shape, _CODE_OFFSET, dtype=np.uint8)
        else:  # packed along the rows: unpack the transposed words, then cut the rows' padding
            self.zero = np.swapaxes(_unpack(np.swapaxes(zero_point, -1, -2)), -1, -2)[..., : shape[-2], :]

    def _per_column(self, values: np.ndarray) -> np.ndarray:
        return np.repeat(values, self.group_size, axis=-1)[..., : self.shape[-1]]

    def dequantized(self) -> np.ndarray:
        """(q - zero) * scale in float32, the producer's own definition of the weight (each product exact)."""
        codes = _unpack(self.packed)[..., : self.shape[-1]].astype(np.float32)
        return (codes - self._per_column(self.zero).astype(np.float32)) * self._per_column(self.scale)

    def blobs(self, group_size: int) -> dict[str, np.ndarray]:
        """int4 blobs with `group_size` (dividing the producer's groups and cols): codes as packed, scales and zero
        points repeated over the artifact groups a producer group spans."""
        repeat = self.group_size // group_size
        with np.errstate(over="ignore"):
            scale = np.repeat(self.scale.astype(np.float16), repeat, axis=-1)
        if not np.all(np.isfinite(scale)):
            raise ConversionError("int4 scales beyond f16's range (+-65504)")
        return {"q": _codes(self.packed)[..., : self.shape[-1] // 2], "scale": scale,
                "zero": np.repeat(self.zero, repeat, axis=-1)}


def native_int4(read: Callable[[], PackedTensor], shape: tuple[int, ...], scheme: PackedInt4,
                scale_is_f16: bool) -> NativeTensor | None:
    """How a packed weight is stored: its codes kept when the groups line up (exact with f16 scales; other scales
    are rounded to f16 and measured), else re-encoded from its dequantised values; None when no int4 group fits
    `cols` (the recipe decides, as for an unquantised weight)."""
    group = scheme.artifact_group(shape[-1])
    if group is None:
        fallback = next((g for g in sorted(GROUP_SIZES, reverse=True) if shape[-1] % g == 0), None)
        return NativeTensor("int4", None, group_size=fallback) if fallback else None
    return NativeTensor("int4", lambda: read().blobs(group), exact=scale_is_f16, group_size=group)
