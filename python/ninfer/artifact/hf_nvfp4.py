"""NVFP4 checkpoints -> the artifact's `nvfp4` encoding without re-quantising: e2m1 codes two per byte (low nibble
the even column), an e4m3 scale per 16 columns and an fp32 global scale, value = e2m1 * scale * global
(encodings.py).

- compressed-tensors `nvfp4-pack-quantized` (read in compressed-tensors 0.20's NVFP4PackedCompressor and
  pack_fp4_to_uint8, compressors/nvfp4; its `dequantize`): `X.weight_packed` uint8 [rows, cols / 2] with the same
  codes and nibble order, `X.weight_scale` float8_e4m3fn [rows, cols / 16] and `X.weight_global_scale` fp32 [1],
  which divides: weight = e2m1 * (scale / global). The artifact's global scale is its reciprocal: exact when the
  global scale is a power of two, else within an f32 rounding or two of each weight, which the converter measures
  and prints.
- ModelOpt NVFP4 (read in ModelOpt's NVFP4QTensor.quantize / dequantize, torch/quantization/qtensor/
  nvfp4_tensor.py, and its Hugging Face export config): `X.weight` uint8 [rows, cols / 2] packed
  `(q[1::2] << 4) | q[0::2]`, `X.weight_scale` float8_e4m3fn [rows, cols / 16] and `X.weight_scale_2` fp32, which
  multiplies: weight = e2m1 * scale * scale_2, the artifact's encoding as it is (exact).

W4A4 checkpoints also carry activation scales (`input_global_scale`, `input_scale`, ModelOpt's `k_scale` /
`v_scale`); they are read past: the engine does not quantise activations, so the artifact is the checkpoint's
weight-only (W4A16) reading, the weights exactly the checkpoint's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from ninfer.artifact.encodings import NVFP4_BLOCK, e2m1_to_f32, e4m3_to_f32, f32_to_e4m3, unpack_nibbles
from ninfer.artifact.gguf_blocks import NativeTensor
from ninfer.artifact.hf_quantized import QuantizedWeight, Read
from ninfer.errors import ConversionError

log = logging.getLogger(__name__)

COMPRESSED_NVFP4_FORMAT = "nvfp4-pack-quantized"


class _Parts:
    """The checkpoint suffixes (after `X.`) of one producer's NVFP4 weight."""

    def __init__(self, packed: str, scale: str, global_scale: str, activation: tuple[str, ...],
                 global_divides: bool) -> None:
        self.packed, self.scale, self.global_scale = packed, scale, global_scale
        self.activation = activation
        self.global_divides = global_divides


_COMPRESSED = _Parts("weight_packed", "weight_scale", "weight_global_scale", ("input_global_scale",), True)
_MODELOPT = _Parts("weight", "weight_scale", "weight_scale_2", ("input_scale", "k_scale", "v_scale"), False)


class PackedNvfp4:
    """An NVFP4 checkpoint's scheme (compressed-tensors or ModelOpt): a QuantizedLayout (hf_quantized.py)."""

    def __init__(self, producer: str, parts: _Parts) -> None:
        self.producer = producer
        self.parts = parts

    def weights(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], read: Read,
                folder: Path) -> dict[str, QuantizedWeight]:
        parts, found = self.parts, {}
        for name in sorted(shapes):
            module = name[: -len("." + parts.scale)] if name.endswith("." + parts.scale) else None
            if module is None or dtypes[name] != "F8_E4M3":
                continue
            packed, global_name = f"{module}.{parts.packed}", f"{module}.{parts.global_scale}"
            missing = [n for n in (packed, global_name) if n not in shapes]
            if missing:
                raise ConversionError(f"{folder}: {name} is an NVFP4 block scale but {', '.join(missing)} is missing")
            rows, half = shapes[packed] if len(shapes[packed]) == 2 else (0, 0)
            if dtypes[packed] != "U8" or not rows or tuple(shapes[name]) != (rows, 2 * half // NVFP4_BLOCK) \
                    or half % (NVFP4_BLOCK // 2) or int(np.prod(shapes[global_name])) != 1:
                raise ConversionError(
                    f"{folder}: {self.producer} NVFP4 {module}: {parts.packed} {dtypes[packed]} "
                    f"{list(shapes[packed])}, {parts.scale} {list(shapes[name])}, {parts.global_scale} "
                    f"{list(shapes[global_name])}; expected U8 [rows, cols / 2], [rows, cols / 16] and one value")
            used = {name, global_name, packed} | {f"{module}.{a}" for a in parts.activation}
            global_value = float(read(global_name).float().reshape(-1)[0])
            found[module + ".weight"] = self._weight(module, (rows, 2 * half), used & shapes.keys(), global_value,
                                                     read)
        dropped = sorted(n for n in shapes if n.rsplit(".", 1)[-1] in self.parts.activation)
        if dropped:
            log.info("%s: %d activation scales (e.g. %s) are not used: the engine computes activations unquantised",
                     folder, len(dropped), dropped[0])
        return found

    def _weight(self, module: str, shape: tuple[int, int], parts: set[str], global_value: float,
                read: Read) -> QuantizedWeight:
        if not np.isfinite(global_value) or global_value <= 0:
            raise ConversionError(f"{module}.{self.parts.global_scale} is {global_value}; expected a positive value")
        artifact_global = np.float32(1 / np.float32(global_value)) if self.parts.global_divides \
            else np.float32(global_value)

        def blobs() -> dict[str, np.ndarray]:
            return {"q": _bytes(read(f"{module}.{self.parts.packed}")),
                    "scale": _bytes(read(f"{module}.{self.parts.scale}")),
                    "global_scale": np.array([artifact_global], dtype=np.float32)}

        def dequantized() -> np.ndarray:
            """e2m1 * (scale / global) or e2m1 * (scale * scale_2) in float32, as each producer computes it."""
            raw = blobs()
            codes = e2m1_to_f32(unpack_nibbles(raw["q"])).reshape(shape[0], -1, NVFP4_BLOCK)
            scale = e4m3_to_f32(raw["scale"])
            step = scale / np.float32(global_value) if self.parts.global_divides else scale * np.float32(global_value)
            return (codes * step[..., None]).reshape(shape)

        # A divided global scale maps exactly only when its reciprocal does: a power of two.
        exact = not self.parts.global_divides or np.frexp(np.float32(global_value))[0] == 0.5
        return QuantizedWeight(shape, f"{module}.{self.parts.packed}", frozenset(parts), dequantized,
                               NativeTensor("nvfp4", blobs, exact=exact, group_size=None))


def _bytes(tensor) -> np.ndarray:
    """A uint8 or float8 torch tensor's raw bytes."""
    import torch

    return tensor.contiguous().view(torch.uint8).numpy()


def stack_nvfp4(experts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-expert nvfp4 blobs as one [E, ...] tensor, which has one global scale: the largest expert's, the others'
    block scales re-expressed against it (re-rounded to e4m3, so exact only when the experts' global scales agree;
    the converter measures the error)."""
    common = max(float(expert["global_scale"][0]) for expert in experts)
    scales = []
    for expert in experts:
        ratio = np.float32(float(expert["global_scale"][0]) / common)
        scales.append(expert["scale"] if ratio == 1 else f32_to_e4m3(e4m3_to_f32(expert["scale"]) * ratio))
    return {"q": np.stack([expert["q"] for expert in experts]), "scale": np.stack(scales),
            "global_scale": np.array([common], dtype=np.float32)}


def compressed_nvfp4_layout(quantization: dict, folder: Path) -> PackedNvfp4:
    """compressed-tensors' NVFP4 scheme, refused unless every config group is nvfp4-pack-quantized fp4 weights with
    16-column groups and no zero points."""
    for name, group in (quantization.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if weights.get("num_bits") != 4 or weights.get("type") != "float" or weights.get("group_size") != 16 \
                or not weights.get("symmetric", True):
            raise ConversionError(f"{folder}: compressed-tensors config group {name!r} ({json.dumps(group)}) is not "
                                  "supported (NVFP4: 4-bit float weights in symmetric groups of 16 is)")
    return PackedNvfp4("compressed-tensors", _COMPRESSED)


def modelopt_layout(quantization: dict, folder: Path) -> PackedNvfp4:
    """ModelOpt's NVFP4 scheme (its `quantization` section: quant_algo NVFP4, group_size 16), refused otherwise."""
    algo, group = str(quantization.get("quant_algo", "")).upper(), quantization.get("group_size", 16)
    if algo != "NVFP4" or group != 16:
        raise ConversionError(f"{folder}: ModelOpt quantization {json.dumps(quantization)} is not supported "
                              "(quant_algo NVFP4 with group_size 16 is)")
    return PackedNvfp4("ModelOpt", _MODELOPT)
