"""GPTQ and AWQ int4 checkpoints -> the artifact's `int4` encoding, without re-quantising where the groups line up.

The layouts as their producers write and read them (read in auto-gptq 0.7.1's `QuantLinear.pack`,
nn_modules/qlinear/qlinear_cuda_old.py; GPTQModel 7.7's `PackableQuantLinear.pack_block`, nn_modules/qlinear, and
`convert_gptq_v1_to_v2_format`, utils/model.py; AutoAWQ 0.2.9's `WQLinear_GEMM.from_linear`,
awq/modules/linear/gemm.py, and `AWQ_ORDER` / `unpack_awq`, awq/utils/packing_utils.py):

- GPTQ: a linear `X` [out, in] is stored as `X.qweight` int32 [in / 8, out] (input row i in bits 4(i % 8)..+3 of
  word row i // 8), `X.qzeros` int32 [groups, out / 8] (output column o in bits 4(o % 8)..+3 of word o // 8),
  `X.scales` fp16 [groups, out] and `X.g_idx` int32 [in], each input row's group: i // group_size, unless
  desc_act (act-order) scattered the groups over the rows. weight[o, i] = (q[i, o] - zero[g_idx[i], o]) *
  scales[g_idx[i], o]. The default checkpoint format "gptq" (v1) stores zero - 1 in each nibble, "gptq_v2" the zero
  itself; symmetric checkpoints have zero 8. group_size -1 is one group of all rows.
- AWQ (the GEMM version): `X.qweight` int32 [in, out / 8] and `X.qzeros` int32 [in / group, out / 8] packed along the
  output columns in AWQ's interleaved order (nibble k of word w holds column 8w + AWQ_ORDER[k]), `X.scales` fp16
  [in / group, out]; weight[o, i] = (q[i, o] - zero[i // group, o]) * scales[i // group, o].

Transposed, both are the artifact's int4 ([out, in] codes, per (row, group of input columns) f16 scale and u8
zero): exact when every artifact group of columns lies inside one producer group (groups of 32, 64, 128 or more,
and per-channel scales, in row order). With desc_act the columns of one group are scattered, no artifact group
holds them, and the weight is re-encoded (as int8) from its dequantised values; the converter prints the error.
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

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble k of an AWQ word holds column 8w + AWQ_ORDER[k]
_IDENTITY = tuple(range(8))
_GPTQ_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint format -> what is added to a stored zero nibble


class PackedGptq:
    """A GPTQ or AWQ checkpoint's int4 scheme: a QuantizedLayout (hf_quantized.py). `group_size` None is one group
    of all input rows; `zero_offset` is added to each stored zero nibble (1 for GPTQ v1)."""

    def __init__(self, method: str, group_size: int | None, zero_offset: int) -> None:
        self.method = method
        self.group_size = group_size
        self.zero_offset = zero_offset

    @property
    def _awq(self) -> bool:
        return self.method == "awq"

    def weights(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], read: Read,
                folder: Path) -> dict[str, QuantizedWeight]:
        """Each `X.qweight` (with its qzeros, scales, g_idx) as `X.weight` [out, in]."""
        found = {}
        for name in sorted(shapes):
            if not name.endswith(".qweight"):
                continue
            module = name[: -len(".qweight")]
            shape, groups = self._check(module, shapes, dtypes, folder)
            column_group = self._column_groups(module, shape[1], groups, shapes, read, folder)
            parts = {f"{module}.{part}" for part in ("qweight", "qzeros", "scales", "g_idx")} & shapes.keys()
            found[module + ".weight"] = quantized_int4(
                shape, name, parts, column_group, dtypes[module + ".scales"],
                lambda module=module, column_group=column_group: self._read(read, module, column_group, folder))
        return found

    def _check(self, module: str, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str],
               folder: Path) -> tuple[tuple[int, int], int]:
        """The weight's [out, in] shape and the number of groups, from the parts' shapes (each checked)."""
        missing = [f"{module}.{part}" for part in ("qzeros", "scales") if f"{module}.{part}" not in shapes]
        if missing:
            raise ConversionError(f"{folder}: {module}.qweight lacks {', '.join(missing)}")
        for part in ("qweight", "qzeros"):
            if dtypes[f"{module}.{part}"] != "I32":
                raise ConversionError(f"{folder}: {module}.{part} is {dtypes[f'{module}.{part}']}; {self.method} "
                                      "int4 is packed in I32")
        packed = shapes[module + ".qweight"]
        if len(packed) != 2:
            raise ConversionError(f"{folder}: {module}.qweight has shape {list(packed)}; expected a matrix")
        out, rows = (packed[1] * 8, packed[0]) if self._awq else (packed[1], packed[0] * 8)
        groups = 1 if self.group_size is None else -(-rows // self.group_size)
        expected = {"qzeros": (groups, out // 8), "scales": (groups, out)}
        for part, want in expected.items():
            if tuple(shapes[f"{module}.{part}"]) != want:
                grouping = f"groups of {self.group_size}" if self.group_size else "one group"
                raise ConversionError(f"{folder}: {module}.{part} has shape {list(shapes[f'{module}.{part}'])}; "
                                      f"{self.method} int4 [{out}, {rows}] with {grouping} needs {list(want)}")
        return (out, rows), groups

    def _column_groups(self, module: str, rows: int, groups: int, shapes: dict[str, tuple[int, ...]], read: Read,
                       folder: Path) -> np.ndarray:
        """Each input row's group: GPTQ's g_idx when it has one (act-order may scatter it), else row // group."""
        size = self.group_size or rows
        if self._awq or f"{module}.g_idx" not in shapes:
            return np.arange(rows) // size
        g_idx = read(f"{module}.g_idx").numpy().astype(np.int64)
        if g_idx.shape != (rows,) or g_idx.min() < 0 or g_idx.max() >= groups:
            raise ConversionError(f"{folder}: {module}.g_idx (shape {list(g_idx.shape)}, values {g_idx.min()}.."
                                  f"{g_idx.max()}) does not give each of {rows} input rows one of {groups} groups")
        return g_idx

    def _read(self, read: Read, module: str, column_group: np.ndarray, folder: Path) -> GroupedInt4:
        import torch

        order = AWQ_ORDER if self._awq else _IDENTITY
        qweight = read(module + ".qweight").numpy()
        # GPTQ packs along the input rows: transposed, its words run along each output row's columns.
        codes = unpack_int32_nibbles(qweight, order).T if self._awq else unpack_int32_nibbles(qweight.T)
        zero = unpack_int32_nibbles(read(module + ".qzeros").numpy(), order) + np.uint8(self.zero_offset)
        if zero.max() > 15:  # a v1 nibble of 15: zero 16, which the 4-bit producers cannot have meant
            raise ConversionError(f"{folder}: {module}.qzeros holds a zero point of {int(zero.max())} (a stored "
                                  "nibble of 15 in the 'gptq' v1 format); int4 zero points are 0..15")
        scale = read(module + ".scales").to(torch.float32).numpy()
        return GroupedInt4(np.ascontiguousarray(codes), np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T),
                           column_group)


def gptq_layout(quantization: dict, folder: Path) -> PackedGptq:
    """The scheme of a GPTQ or AWQ quantization config (config.json's quantization_config, or an older GPTQ
    checkpoint's quantize_config.json), refused by name unless it is 4-bit GPTQ ("gptq" / "gptq_v2" format) or
    4-bit AWQ in the GEMM layout with zero points."""
    method = quantization.get("quant_method", "gptq")
    bits = quantization.get("bits", quantization.get("w_bit"))
    group_size = quantization.get("group_size", quantization.get("q_group_size"))

    def refuse(why: str) -> ConversionError:
        return ConversionError(f"{folder}: {method} quantization config {json.dumps(quantization)} is not supported: "
                               f"{why}")

    if bits != 4:
        raise refuse(f"{bits}-bit weights (4-bit ones are)")
    if group_size in (None, -1):
        group_size = None
    elif not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise refuse(f"group_size {group_size!r} is not a positive integer or -1")
    if method == "awq":
        version = str(quantization.get("version") or quantization.get("format") or "gemm").lower()
        if version != "gemm":
            raise refuse(f"the {version!r} packing (AWQ's GEMM packing is)")
        if not quantization.get("zero_point", True):
            raise refuse("zero_point false (AWQ's GEMM packing stores zero points)")
        return PackedGptq("awq", group_size, 0)
    checkpoint_format = quantization.get("format") or quantization.get("checkpoint_format") or "gptq"
    if checkpoint_format not in _GPTQ_FORMATS:
        raise refuse(f"checkpoint format {checkpoint_format!r} ({', '.join(_GPTQ_FORMATS)} are)")
    return PackedGptq("gptq", group_size, _GPTQ_FORMATS[checkpoint_format])
