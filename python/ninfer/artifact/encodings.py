"""Weight encodings of the `.ninfer` v3 format: blob layouts, quantizers and reference dequantizers (numpy).

A tensor of shape `[..., rows, cols]` is viewed as a `[R, cols]` matrix (R = product of the leading axes);
every encoding is row-local except nvfp4's one per-tensor global scale, so the quantizers work on row chunks
and keep their temporaries small enough for a 248320 x 5120 embedding. `decode` is the reference dequantizer:
the C++ kernels and the tests compare against it.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np

from ninfer.errors import ArtifactError, ConversionError

ENCODINGS = ("f32", "f16", "bf16", "fp8_e4m3", "int8", "int4", "int4_affine", "nvfp4")
PLAIN_ENCODINGS = ("f32", "f16", "bf16")
# int8 / int4: (code - zero) * scale, an integer zero point. int4_affine: code * scale + offset, an f16 offset (the
# group's minimum): GGUF Q4_1's blocks exactly, whose minimum is not a whole number of steps from 0.
GROUPED_ENCODINGS = ("int8", "int4", "int4_affine")
GROUP_SIZES = (32, 64, 128)
NVFP4_BLOCK = 16
E4M3_MAX = 448.0
E2M1_MAX = 6.0
_INT_QMAX = {"int8": 255, "int4": 15}
# Rows per quantizer step: about 4M values, so temporaries stay around 16 MB whatever the matrix.
_CHUNK_VALUES = 1 << 22

T = TypeVar("T")


class BlobSpec(NamedTuple):
    """A blob's element type and shape; `nbytes` is what the manifest must record for it."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


_U8 = np.dtype(np.uint8)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
# numpy has no bfloat16: bf16 blobs are handled as their raw 16-bit patterns.
_PLAIN_DTYPES = {"f32": _F32, "f16": _F16, "bf16": np.dtype(np.uint16)}


# --- scalar formats --------------------------------------------------------------------------------------


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """bf16 bit patterns, rounded to nearest even; NaN stays a (quiet) NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    magnitude[(codes & 0x7F) == 0x7F] = np.nan
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


E4M3_TABLE = _e4m3_table()
E2M1_TABLE = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
_E4M3_MIN_NORMAL = np.float32(2.0**-6)


def f32_to_e4m3(values: np.ndarray) -> np.ndarray:
    """OCP E4M3FN codes, rounded to nearest even and saturating to +-448; NaN becomes 0x7f/0xff."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    magnitude = np.abs(values)
    np.minimum(magnitude, np.float32(E4M3_MAX), out=magnitude)
    # Normal range: round the f32 mantissa to 3 bits (nearest even), then rebias the exponent (127 -> 7):
    # the code is the rounded f32 bits >> 20, minus 120 << 3. In-place steps: this runs over whole lm_heads.
    bits = magnitude.view(np.int32)
    codes = bits >> 20
    codes &= 1
    codes += 0x7FFFF
    codes += bits
    codes >>= 20
    codes -= 120 << 3
    # Subnormal range: multiples of 2^-9 (2^-6 itself is code 8 either way).
    small = magnitude < _E4M3_MIN_NORMAL
    codes[small] = np.rint(magnitude[small] * np.float32(512.0)).astype(np.int32)
    # Only NaN (clamping keeps NaN) lands above the largest finite code 0x7e.
    np.minimum(codes, 0x7F, out=codes)
    codes |= (values.view(np.int32) >> 24) & 0x80
    return codes.astype(np.uint8)


def e4m3_to_f32(codes: np.ndarray) -> np.ndarray:
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def f32_to_e2m1(values: np.ndarray) -> np.ndarray:
    """e2m1 codes (bit 3 = sign), rounded to the nearest of 0, .5, 1, 1.5, 2, 3, 4, 6 (ties to the even code),
    saturating at 6."""
    magnitude = np.abs(np.asarray(values, dtype=np.float32))
    # Each midpoint between neighbouring codes: ties go to the even code, so `>` where the lower code is even
    # and `>=` where the upper one is.
    codes = (magnitude > 0.25).astype(np.uint8)
    codes += magnitude >= 0.75
    codes += magnitude > 1.25
    codes += magnitude >= 1.75
    codes += magnitude > 2.5
    codes += magnitude >= 3.5
    codes += magnitude > 5.0
    codes |= np.signbit(values).astype(np.uint8) << 3
    return codes


def e2m1_to_f32(codes: np.ndarray) -> np.ndarray:
    return E2M1_TABLE[np.asarray(codes, dtype=np.uint8) & 0xF]


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes per byte along the last axis: low nibble = even column."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


# --- layouts ---------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def encoding_problem(encoding: str, shape: Sequence[int], group_size: int | None) -> str | None:
    """Why `shape` cannot be stored as `encoding` with `group_size`, or None when it can."""
    if encoding not in ENCODINGS:
        return f"unknown encoding {encoding!r} (known: {', '.join(ENCODINGS)})"
    if len(shape) == 0 or any(not _is_int(d) or d < 1 for d in shape):
        return f"shape {list(shape)} is not a list of positive integers"
    if encoding in GROUPED_ENCODINGS:
        if not _is_int(group_size) or group_size not in GROUP_SIZES:
            return f"{encoding} needs group_size 32, 64 or 128, not {group_size}"
    elif group_size is not None:
        return f"{encoding} takes no group_size (got {group_size})"
    if encoding in PLAIN_ENCODINGS:
        return None
    if len(shape) < 2:
        return f"{encoding} needs a matrix [..., rows, cols], not shape {list(shape)}"
    cols = shape[-1]
    if encoding in GROUPED_ENCODINGS and cols % group_size:
        return f"{encoding} needs cols ({cols}) to be a multiple of group_size {group_size}"
    if encoding == "nvfp4" and cols % NVFP4_BLOCK:
        return f"nvfp4 needs cols ({cols}) to be a multiple of {NVFP4_BLOCK}"
    return None


def _require_possible(encoding: str, shape: Sequence[int], group_size: int | None) -> None:
    problem = encoding_problem(encoding, shape, group_size)
    if problem:
        raise ArtifactError(problem)


def blob_specs(encoding: str, shape: Sequence[int], group_size: int | None) -> dict[str, BlobSpec]:
    """Every blob of a tensor, in file order, with its dtype and shape (no data needed)."""
    _require_possible(encoding, shape, group_size)
    shape = tuple(shape)
    if encoding in PLAIN_ENCODINGS:
        return {"data": BlobSpec(_PLAIN_DTYPES[encoding], shape)}
    lead, cols = shape[:-1], shape[-1]
    if encoding == "fp8_e4m3":
        return {"q": BlobSpec(_U8, shape), "scale": BlobSpec(_F32, lead)}
    if encoding == "int4_affine":
        groups = lead + (cols // group_size,)
        return {
            "q": BlobSpec(_U8, lead + (cols // 2,)),
            "scale": BlobSpec(_F16, groups),
            "offset": BlobSpec(_F16, groups),
        }
    if encoding in GROUPED_ENCODINGS:
        q_cols = cols if encoding == "int8" else cols // 2
        groups = lead + (cols // group_size,)
        return {
            "q": BlobSpec(_U8, lead + (q_cols,)),
            "scale": BlobSpec(_F16, groups),
            "zero": BlobSpec(_U8, groups),
        }
    return {  # nvfp4
        "q": BlobSpec(_U8, lead + (cols // 2,)),
        "scale": BlobSpec(_U8, lead + (cols // NVFP4_BLOCK,)),
        "global_scale": BlobSpec(_F32, (1,)),
    }


# --- quantizers (one [rows, cols] float32 chunk each) ----------------------------------------------------


def _require_finite(statistic: np.ndarray | np.floating, encoding: str) -> None:
    if not np.all(np.isfinite(statistic)):
        raise ConversionError(
            f"cannot encode as {encoding}: the tensor holds non-finite values or its range "
            "overflows the scale format"
        )


def _safe_divisor(scale: np.ndarray) -> np.ndarray:
    """Scale with zeros replaced by 1: an all-zero row/group/block quantizes to code 0 either way."""
    return np.where(scale > 0, scale, np.float32(1)).astype(np.float32)


def _f16_round_up(values: np.ndarray) -> np.ndarray:
    """The smallest f16 >= each value: a scale rounded down would shrink the range and clip the extremes."""
    rounded = values.astype(np.float16)
    low = rounded.astype(np.float32) < values
    rounded[low] = np.nextafter(rounded[low], np.float16(np.inf))
    return rounded


def _encode_fp8(chunk: np.ndarray) -> dict[str, np.ndarray]:
    amax = np.abs(chunk).max(axis=1)
    _require_finite(amax, "fp8_e4m3")
    scale = (amax / np.float32(E4M3_MAX)).astype(np.float32)
    return {"q": f32_to_e4m3(chunk / _safe_divisor(scale)[:, None]), "scale": scale}


def _encode_int(chunk: np.ndarray, group_size: int, qmax: int, encoding: str) -> dict[str, np.ndarray]:
    rows, cols = chunk.shape
    groups = chunk.reshape(rows, cols // group_size, group_size)
    # The range always holds 0, so the zero point is an integer code in [0, qmax] and 0.0 is exact.
    low = np.minimum(groups.min(axis=2), np.float32(0))
    high = np.maximum(groups.max(axis=2), np.float32(0))
    scale = _f16_round_up((high - low) / np.float32(qmax))
    _require_finite(scale, encoding)
    divisor = _safe_divisor(scale.astype(np.float32))
    zero = np.clip(np.rint(-low / divisor), 0, qmax)
    q = np.rint(groups / divisor[..., None])
    q += zero[..., None]
    np.clip(q, 0, qmax, out=q)
    q = q.astype(np.uint8).reshape(rows, cols)
    if encoding == "int4":
        q = pack_nibbles(q)
    return {"q": q, "scale": scale, "zero": zero.astype(np.uint8)}


def _encode_int4_affine(chunk: np.ndarray, group_size: int) -> dict[str, np.ndarray]:
    """Q4_1's quantizer: offset = the group's minimum (as f16), scale = its range / 15 (f16, rounded up so the
    top code still reaches the maximum)."""
    rows, cols = chunk.shape
    groups = chunk.reshape(rows, cols // group_size, group_size)
    offset = groups.min(axis=2).astype(np.float16)
    _require_finite(offset, "int4_affine")
    scale = _f16_round_up((groups.max(axis=2) - offset.astype(np.float32)) / np.float32(15))
    _require_finite(scale, "int4_affine")
    q = np.rint((groups - offset.astype(np.float32)[..., None]) / _safe_divisor(scale.astype(np.float32))[..., None])
    np.clip(q, 0, 15, out=q)
    return {"q": pack_nibbles(q.astype(np.uint8).reshape(rows, cols)), "scale": scale, "offset": offset}


def _encode_nvfp4(chunk: np.ndarray, global_scale: np.float32) -> dict[str, np.ndarray]:
    rows, cols = chunk.shape
    blocks = chunk.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = np.abs(blocks).max(axis=2)
    # Block scales are e4m3 relative to the global scale, which maps the tensor's amax onto 448 * 6.
    block_scale = f32_to_e4m3(block_amax / (np.float32(E2M1_MAX) * _safe_divisor(np.float32(global_scale))))
    step = e4m3_to_f32(block_scale) * np.float32(global_scale)
    codes = f32_to_e2m1(blocks / _safe_divisor(step)[..., None]).reshape(rows, cols)
    return {"q": pack_nibbles(codes), "scale": block_scale}


def _encode_chunk(
    chunk: np.ndarray, encoding: str, group_size: int | None, global_scale: np.float32
) -> dict[str, np.ndarray]:
    if encoding == "f32":
        return {"data": chunk}
    if encoding == "f16":
        with np.errstate(over="ignore"):  # overflow is detected just below, with a clearer message
            data = chunk.astype(np.float16)
        if np.any(np.isinf(data) & np.isfinite(chunk)):
            raise ConversionError("cannot encode as f16: values beyond its range (+-65504)")
        return {"data": data}
    if encoding == "bf16":
        return {"data": f32_to_bf16_bits(chunk)}
    if encoding == "fp8_e4m3":
        return _encode_fp8(chunk)
    if encoding == "int4_affine":
        return _encode_int4_affine(chunk, group_size)
    if encoding in GROUPED_ENCODINGS:
        return _encode_int(chunk, group_size, _INT_QMAX[encoding], encoding)
    return _encode_nvfp4(chunk, global_scale)


def _row_view(values: np.ndarray) -> np.ndarray:
    return values.reshape(-1, values.shape[-1])


def _nvfp4_global_scale(rows: np.ndarray, chunk_rows: int) -> np.float32:
    amax = max(
        float(np.abs(np.asarray(rows[i : i + chunk_rows], np.float32)).max())
        for i in range(0, rows.shape[0], chunk_rows)
    )
    _require_finite(np.float32(amax), "nvfp4")
    return np.float32(np.float32(amax) / np.float32(E4M3_MAX * E2M1_MAX))


def encode_chunks(
    values: np.ndarray, encoding: str, group_size: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """The tensor's blobs, a block of rows at a time: concatenating each blob's pieces (in order, flattened)
    gives that blob. Per-tensor blobs (nvfp4's global_scale) come once, with the first piece."""
    values = np.asarray(values)
    _require_possible(encoding, values.shape, group_size)
    if not np.issubdtype(values.dtype, np.floating):
        raise ConversionError(f"cannot encode a {values.dtype} array as {encoding}: expected floating point")
    rows = _row_view(values)
    chunk_rows = max(1, _CHUNK_VALUES // rows.shape[1])
    global_scale = np.float32(1)
    if encoding == "nvfp4":
        global_scale = _nvfp4_global_scale(rows, chunk_rows)

    def encode_rows(start: int) -> dict[str, np.ndarray]:
        chunk = np.asarray(rows[start : start + chunk_rows], dtype=np.float32)
        pieces = _encode_chunk(chunk, encoding, group_size, global_scale)
        if encoding == "nvfp4" and start == 0:
            pieces["global_scale"] = np.array([global_scale], dtype=np.float32)
        return pieces

    yield from _map_in_order(encode_rows, range(0, rows.shape[0], chunk_rows))


def _map_in_order(fn: Callable[[int], T], items: Iterable[int]) -> Iterator[T]:
    """`map(fn, items)` on a few threads (numpy releases the GIL), at most two results ahead of the consumer
    so memory stays bounded however slow the writer is."""
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        pending: deque[Future[T]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def encode(values: np.ndarray, encoding: str, group_size: int | None) -> dict[str, np.ndarray]:
    """Every blob of `values` in `encoding`, each with the dtype and shape of `blob_specs`."""
    values = np.asarray(values)
    specs = blob_specs(encoding, values.shape, group_size)
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in specs}
    for chunk in encode_chunks(values, encoding, group_size):
        for name, piece in chunk.items():
            pieces[name].append(piece.reshape(-1))
    return {
        name: np.concatenate(pieces[name]).astype(spec.dtype, copy=False).reshape(spec.shape)
        for name, spec in specs.items()
    }


# --- reference dequantizers ------------------------------------------------------------------------------


def decode(
    blobs: dict[str, np.ndarray], encoding: str, shape: Sequence[int], group_size: int | None
) -> np.ndarray:
    """float32 values of a stored tensor: the definition each kernel is checked against."""
    specs = blob_specs(encoding, shape, group_size)
    arrays = {}
    for name, spec in specs.items():
        if name not in blobs:
            raise ArtifactError(f"{encoding} tensor lacks its {name!r} blob")
        arrays[name] = np.asarray(blobs[name]).view(spec.dtype).reshape(spec.shape)
    shape = tuple(shape)
    if encoding == "bf16":
        return bf16_bits_to_f32(arrays["data"])
    if encoding in PLAIN_ENCODINGS:
        return arrays["data"].astype(np.float32)
    if encoding == "fp8_e4m3":
        return e4m3_to_f32(arrays["q"]) * arrays["scale"][..., None]
    if encoding == "int4_affine":
        # code * scale is exact in f32 (4 + 11 significant bits), so this is one rounding, fused or not.
        codes = unpack_nibbles(arrays["q"]).reshape(shape[:-1] + (shape[-1] // group_size, group_size))
        scale = arrays["scale"].astype(np.float32)[..., None]
        offset = arrays["offset"].astype(np.float32)[..., None]
        return (codes.astype(np.float32) * scale + offset).reshape(shape)
    if encoding in GROUPED_ENCODINGS:
        q = arrays["q"] if encoding == "int8" else unpack_nibbles(arrays["q"])
        grouped = q.reshape(shape[:-1] + (shape[-1] // group_size, group_size)).astype(np.float32)
        zero = arrays["zero"].astype(np.float32)[..., None]
        scale = arrays["scale"].astype(np.float32)[..., None]
        return ((grouped - zero) * scale).reshape(shape)
    # nvfp4
    values = e2m1_to_f32(unpack_nibbles(arrays["q"])).reshape(
        shape[:-1] + (shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
    )
    block = e4m3_to_f32(arrays["scale"])[..., None]
    return ((values * block) * arrays["global_scale"][0]).reshape(shape)
