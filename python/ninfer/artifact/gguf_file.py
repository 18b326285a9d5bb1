"""A GGUF file's metadata and tensor table, read with bounds checks and without building per-item objects.

gguf-py's `GGUFReader` makes a numpy view for every string of the metadata: on a 248k-token Qwen3.5 vocabulary
(750k strings with its merges) that takes over a minute. This reader walks the same layout once with `struct`,
refusing any length or count the file cannot hold (a corrupt header must never make it loop over 2^62 items or
read past the end), and hands out each tensor's bytes as a view of one read-only memory map. Dequantizing stays
with gguf-py's `quants` (convert's loaders), which takes exactly these byte arrays.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ninfer.errors import ConversionError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
# The smallest a tensor-info or key/value entry can be (an 8-byte name length, the name, a 4-byte type, ...): a count
# the file cannot hold at this size is refused before anything loops over it.
MIN_ENTRY_BYTES = 12
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32  # general.alignment when the file does not say

# GGUF value types -> struct format; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}
_STRING, _ARRAY = 8, 9

# llama.cpp's tensor names that every architecture read here shares -> logical names (docs/artifact-format.md).
TOP_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}
ATTENTION_NAMES = {
    "attn_norm.weight": "input_norm",
    "attn_q.weight": "attn.q_proj",
    "attn_k.weight": "attn.k_proj",
    "attn_v.weight": "attn.v_proj",
    "attn_output.weight": "attn.o_proj",
}


@dataclass(frozen=True)
class FileTensor:
    """One tensor of the table: `shape` in GGUF order (fastest dimension first) and `data`, its bytes as uint8 of
    shape (ne[n-1], ..., ne[1], bytes per row): what gguf's `quants.dequantize` takes."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: np.ndarray
    data: np.ndarray


class _Cursor:
    """Reads the header front to back; every length must fit in what is left of the file."""

    def __init__(self, path: Path, data: np.ndarray) -> None:
        self.path, self.data, self.at, self.size = path, data, 0, len(data)

    def take(self, n: int, what: str) -> int:
        """Skips `n` bytes; returns where they start."""
        if n > self.size - self.at:
            raise ConversionError(f"{self.path}: {what} at byte {self.at} needs {n} bytes, more than the file has "
                                  "left (truncated or corrupt)")
        self.at += n
        return self.at - n

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack_from("<" + fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.number("Q", f"{what}'s length")
        start = self.take(n, what)
        try:
            return bytes(self.data[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConversionError(f"{self.path}: {what} is not UTF-8 ({exc.reason})") from exc

    def value(self, kind: int, what: str) -> object:
        if kind == _STRING:
            return self.string(what)
        if kind in _SCALARS:
            return self.number(_SCALARS[kind], what)
        if kind != _ARRAY:
            raise ConversionError(f"{self.path}: {what} has the unknown GGUF value type {kind}")
        item_kind, count = self.number("I", f"{what}'s item type"), self.number("Q", f"{what}'s length")
        if item_kind in _NUMPY:
            dtype = np.dtype(_NUMPY[item_kind])
            start = self.take(count * dtype.itemsize, what)
            return np.frombuffer(self.data, dtype, count, start).tolist()
        if item_kind != _STRING:  # nested arrays: GGUF writers never produce them for model metadata
            raise ConversionError(f"{self.path}: {what} is an array of GGUF value type {item_kind} (not supported)")
        if count > (self.size - self.at) // 8:  # each string item is at least its 8-byte length
            raise ConversionError(f"{self.path}: {what} declares {count} items, more than the file can hold")
        return [self.string(what) for _ in range(count)]


class GGUFFile:
    """`fields` (metadata key -> value: int, float, bool, str or list) and `tensors` of a GGUF file."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        with path.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise ConversionError(f"{path}: not a GGUF file (no GGUF magic in its first 4 bytes)")
        self.path = path
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        cursor = _Cursor(path, self._map)
        cursor.at = 4  # past the magic, checked first
        version = cursor.number("I", "the version")
        if version not in GGUF_VERSIONS:
            raise ConversionError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_kv = cursor.number("Q", "the tensor count"), cursor.number("Q", "the metadata count")
        for count, what in ((n_tensors, "tensors"), (n_kv, "metadata keys")):
            if count > cursor.size // MIN_ENTRY_BYTES:
                raise ConversionError(f"{path}: the GGUF header declares {count} {what}, more than a file of "
                                      f"{cursor.size} bytes can hold (truncated or corrupt)")
        self.fields: dict[str, object] = {}
        for index in range(n_kv):
            key = cursor.string(f"metadata key {index}")
            self.fields[key] = cursor.value(cursor.number("I", f"metadata {index}'s type"), f"metadata {key}")
        infos = [self._tensor_info(cursor, index) for index in range(n_tensors)]
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1:
            raise ConversionError(f"{path}: general.alignment {alignment!r} is not a positive integer")
        data_start = -(-cursor.at // alignment) * alignment
        self.tensors = [self._tensor(data_start, *info) for info in infos]

    def _tensor_info(self, cursor: _Cursor, index: int) -> tuple[str, list[int], int, int]:
        name = cursor.string(f"tensor {index}'s name")
        dims = cursor.number("I", f"tensor {name}'s dimension count")
        if not 0 < dims <= MAX_DIMS:
            raise ConversionError(f"{self.path}: tensor {name} has {dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
        shape = [cursor.number("Q", f"tensor {name}'s shape") for _ in range(dims)]
        return name, shape, cursor.number("I", f"tensor {name}'s type"), cursor.number("Q", f"tensor {name}'s offset")

    def _tensor(self, data_start: int, name: str, shape: list[int], type_id: int, offset: int) -> FileTensor:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise ConversionError(f"{self.path}: tensor {name} has the unknown GGML type {type_id}") from None
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        if any(d < 1 for d in shape) or shape[0] % block:
            raise ConversionError(f"{self.path}: tensor {name} of shape {shape} does not fit {qtype.name} blocks "
                                  f"of {block}")
        row_bytes = shape[0] // block * type_bytes
        rows = int(np.prod(shape[1:], dtype=object))
        start = data_start + offset
        if start + rows * row_bytes > len(self._map):
            raise ConversionError(f"{self.path}: tensor {name} ({rows * row_bytes} bytes at {start}) runs past the "
                                  f"end of the file ({len(self._map)} bytes): truncated or corrupt")
        data = self._map[start:start + rows * row_bytes].reshape(tuple(reversed(shape[1:])) + (row_bytes,))
        return FileTensor(name, qtype, np.array(shape), data)
