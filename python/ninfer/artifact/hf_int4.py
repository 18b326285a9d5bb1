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
weight is re-encoded (as int8) from its dequantised values; the converter prints the error either adds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ninfer.artifact.hf_quantized import (
    GroupedInt4,
    QuantizedWeight,
    Read,
    quantized_int4,
    unpack_int32_nibbles,
)
from ninfer.errors import ConversionError

PACKED_SUFFIX = "_packed"  # `X.weight_packed` packs `X.weight`
_PARTS = ("_packed", "_scale", "_zero_point", "_shape")
_CODE_OFFSET = 8  # the producer stores a signed int4 code q as the nibble q + 8


class PackedInt4:
    """The pack-quantized scheme of a checkpoint: group size (None: one scale per row) and symmetry; a
    QuantizedLayout (hf_quantized.py)."""

    def __init__(self, group_size: int | None, symmetric: bool) -> None:
        self.group_size = group_size
        self.symmetric = symmetric

    def weights(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], read: Read,
                folder: Path) -> dict[str, QuantizedWeight]:
        """Each `X.weight_packed` as `X.weight`, with the unpacked shape its `X.weight_shape` gives."""
        found = {}
        for weight in _packed_weights(shapes, dtypes, self, folder):
            shape = tuple(int(d) for d in read(weight + "_shape").tolist())
            _check_parts(weight, shape, shapes, self, folder)
            size = self.group_size or shape[-1]
            found[weight] = quantized_int4(shape, weight + PACKED_SUFFIX, set(_consumed_names(weight)) & shapes.keys(),
                                           np.arange(shape[-1]) // size, dtypes[weight + "_scale"],
                                           lambda weight=weight, shape=shape, size=size: _read_packed(
                                               read, weight, shape, size, self.symmetric))
        return found


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


def _packed_weights(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], scheme: PackedInt4,
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


def _check_parts(weight: str, shape: tuple[int, ...], shapes: dict[str, tuple[int, ...]], scheme: PackedInt4,
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


def _consumed_names(prefix: str) -> list[str]:
    return [prefix + part for part in _PARTS]


def _read_packed(read: Read, weight: str, shape: tuple[int, ...], group_size: int, symmetric: bool) -> GroupedInt4:
    """One packed weight's codes, scales and zero points: the stored nibbles are the signed values + 8, so they are
    the unsigned codes and zero points as they are (a symmetric scheme's zero point is 0, nibble 8)."""
    import torch

    codes = unpack_int32_nibbles(read(weight + "_packed").numpy())[..., : shape[-1]]
    scale = read(weight + "_scale").to(torch.float32).numpy()
    if symmetric:
        zero = np.full(scale.shape, _CODE_OFFSET, dtype=np.uint8)
    else:  # packed along the rows: unpack the transposed words, then cut the rows' padding
        packed_zero = read(weight + "_zero_point").numpy()
        zero = np.swapaxes(unpack_int32_nibbles(np.swapaxes(packed_zero, -1, -2)), -1, -2)[..., : shape[-2], :]
    return GroupedInt4(codes, scale, zero, np.arange(shape[-1]) // group_size)
