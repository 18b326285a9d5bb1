"""GGUF file (arch `llama` or `qwen2`) -> `Source`, through the PyPI `gguf` package.

Float tensors are read as float32 and encoded per the recipe. Quantised ones keep their blocks where an artifact
encoding holds them exactly (gguf_blocks.py); the rest are dequantized by `gguf.quants.dequantize` and re-encoded. Q/K of GGUF `llama` are kept exactly as stored: llama.cpp's converter permutes their rows so that RoPE
rotates adjacent pairs (2j, 2j+1), so the artifact says `rope.pairing = "interleaved"` instead of undoing the
permutation. (`qwen2` GGUFs are not permuted: llama.cpp runs them with NeoX pairing, `"half"`.)
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ninfer.artifact.convert import Source, SourceTensor, decoder_config, unsupported_architecture
from ninfer.artifact.gguf_blocks import native_tensor
from ninfer.artifact.tokenizer_build import gguf_tokenizer_json
from ninfer.errors import ConversionError

_ROPE_PAIRING = {"llama": "interleaved", "qwen2": "half"}
_TOP_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_norm",
    "ffn_norm.weight": "post_attn_norm",
    "attn_q.weight": "attn.q_proj",
    "attn_k.weight": "attn.k_proj",
    "attn_v.weight": "attn.v_proj",
    "attn_output.weight": "attn.o_proj",
    "attn_q.bias": "attn.q_bias",
    "attn_k.bias": "attn.k_bias",
    "attn_v.bias": "attn.v_bias",
    "ffn_gate.weight": "mlp.gate",
    "ffn_up.weight": "mlp.up",
    "ffn_down.weight": "mlp.down",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def _field(reader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _required(reader, path: Path, key: str) -> object:
    value = _field(reader, key)
    if value is None:
        raise ConversionError(f"{path}: GGUF metadata lacks {key}")
    return value


def logical_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
    return None


def _loader(tensor) -> Callable[[], np.ndarray]:
    from gguf import quants

    def load() -> np.ndarray:
        try:
            return np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except _MALFORMED as exc:  # a corrupt type or shape, seen only when the data is read
            raise ConversionError(f"GGUF tensor {tensor.name}: unreadable data ({type(exc).__name__}: "
                                  f"{_one_line(exc)})") from exc

    return load


def _tensors(reader, path: Path) -> list[SourceTensor]:
    tensors, unknown = [], []
    for tensor in reader.tensors:
        logical = logical_name(tensor.name)
        if logical is None:
            unknown.append(tensor.name)
            continue
        # GGUF lists dimensions fastest-first; the row-major shape is the reverse.
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        native = native_tensor(tensor.tensor_type.name, tensor.data, shape)
        tensors.append(SourceTensor(logical, shape, _loader(tensor), native))
    if unknown:
        raise ConversionError(f"{path}: GGUF tensors this converter does not know: {', '.join(unknown[:5])}")
    return tensors


def _tokenizer(reader, path: Path) -> str:
    model = str(_required(reader, path, "tokenizer.ggml.model"))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    return gguf_tokenizer_json(
        model=model,
        prepend_id=int(bos) if add_bos else None,
        pre=_field(reader, "tokenizer.ggml.pre"),
        tokens=list(_required(reader, path, "tokenizer.ggml.tokens")),
        merges=list(_field(reader, "tokenizer.ggml.merges", [])),
        token_types=list(_field(reader, "tokenizer.ggml.token_type", [])),
    )


GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
# The smallest a tensor-info or key/value entry can be (an 8-byte name length, the name, a 4-byte type, ...): a count
# the file cannot hold at this size is refused before the gguf package loops over it.
MIN_ENTRY_BYTES = 12
MAX_DIMS = 4  # GGML_MAX_DIMS
# What the gguf package raises on a file that is cut short or corrupt (it indexes and reshapes memory-mapped arrays
# as the header says): turned into one ConversionError naming the file, never a traceback.
_MALFORMED = (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError, struct.error,
              AttributeError, ZeroDivisionError)


# GGUF value types (gguf.GGUFValueType) -> their size in bytes; 8 is a string, 9 an array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Walks the GGUF header's lengths without building anything: every length must fit in what is left of the
    file, so the gguf package never loops over a count the file cannot hold (it would, for 2^62 array items)."""

    def __init__(self, path: Path, data: bytes | mmap.mmap) -> None:
        self.path, self.data, self.at = path, data, 0

    def take(self, n: int, what: str) -> int:
        """Skips `n` bytes; returns where they start."""
        if n > len(self.data) - self.at:
            raise ConversionError(f"{self.path}: {what} at byte {self.at} needs {n} bytes, more than the file has "
                                  "left (truncated or corrupt)")
        self.at += n
        return self.at - n

    def number(self, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        return struct.unpack_from("<" + fmt, self.data, self.take(size, what))[0]

    def string(self, what: str) -> None:
        self.take(self.number("Q", f"{what}'s length"), what)

    def value(self, kind: int, what: str, depth: int = 0) -> None:
        if kind == _STRING:
            self.string(what)
        elif kind == _ARRAY and depth == 0:
            item_kind, count = self.number("I", f"{what}'s item type"), self.number("Q", f"{what}'s length")
            if item_kind in _SCALAR_BYTES:
                self.take(count * _SCALAR_BYTES[item_kind], what)
                return
            if count > (len(self.data) - self.at) // 8:  # each string item is at least its 8-byte length
                raise ConversionError(f"{self.path}: {what} declares {count} items, more than the file can hold")
            for _ in range(count):
                self.value(item_kind, what, depth + 1)
        elif kind in _SCALAR_BYTES:
            self.take(_SCALAR_BYTES[kind], what)
        else:
            raise ConversionError(f"{self.path}: {what} has the unknown GGUF value type {kind}")


def _check_header(path: Path) -> None:
    """Magic, version, and every count and length of the metadata and tensor table against the file's size."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size < 4 or f.read(4) != GGUF_MAGIC:
            raise ConversionError(f"{path}: not a GGUF file (no GGUF magic in its first 4 bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _walk(path, data)


def _walk(path: Path, data: mmap.mmap) -> None:
    cursor = _Cursor(path, data)
    cursor.at = 4  # past the magic, checked first
    version = cursor.number("I", "the version")
    if version not in GGUF_VERSIONS:
        raise ConversionError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = cursor.number("Q", "the tensor count"), cursor.number("Q", "the metadata count")
    for count, what in ((n_tensors, "tensors"), (n_kv, "metadata keys")):
        if count > len(data) // MIN_ENTRY_BYTES:
            raise ConversionError(f"{path}: the GGUF header declares {count} {what}, more than a file of "
                                  f"{len(data)} bytes can hold (truncated or corrupt)")
    for index in range(n_kv):
        cursor.string(f"metadata key {index}")
        cursor.value(cursor.number("I", f"metadata {index}'s type"), f"metadata value {index}")
    for index in range(n_tensors):
        cursor.string(f"tensor {index}'s name")
        dims = cursor.number("I", f"tensor {index}'s dimension count")
        if dims > MAX_DIMS:
            raise ConversionError(f"{path}: tensor {index} has {dims} dimensions (GGUF allows {MAX_DIMS})")
        cursor.take(8 * dims + 4 + 8, f"tensor {index}'s shape, type and offset")


def open_gguf_file(path: Path) -> Source:
    """The GGUF file as a Source; a truncated or corrupt file is a ConversionError naming the file."""
    try:
        _check_header(path)
        return _open_checked(path)
    except OSError as exc:
        raise ConversionError(f"{path}: not a readable GGUF file: {exc.strerror or exc}") from exc
    except _MALFORMED as exc:
        raise ConversionError(f"{path}: not a readable GGUF file (truncated or corrupt: {type(exc).__name__}: "
                              f"{_one_line(exc)})") from exc


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "..."


def _open_checked(path: Path) -> Source:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = str(_required(reader, path, "general.architecture"))
    if arch not in _ROPE_PAIRING:
        raise unsupported_architecture(path, "GGUF architecture", arch)

    tensors = _tensors(reader, path)
    names = {t.name for t in tensors}
    heads = int(_required(reader, path, f"{arch}.attention.head_count"))
    hidden = int(_required(reader, path, f"{arch}.embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    num_layers = int(_required(reader, path, f"{arch}.block_count"))
    if not 0 < num_layers <= len(tensors):  # every layer has tensors: a larger count is corruption
        raise ConversionError(f"{path}: GGUF block_count {num_layers} does not match its {len(tensors)} tensors")
    embed = next(t for t in tensors if t.name == "embed") if "embed" in names else None
    if embed is None:
        raise ConversionError(f"{path}: GGUF has no token_embd.weight")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    pad = _field(reader, "tokenizer.ggml.padding_token_id")
    eos_ids = [] if eos is None else [int(eos)]
    bos_id = None if bos is None else int(bos)
    config = decoder_config(
        arch=arch,
        vocab_size=embed.shape[0],
        hidden_size=hidden,
        num_layers=num_layers,
        layer_types=["full_attention"] * num_layers,
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=int(_required(reader, path, f"{arch}.feed_forward_length")),
        rms_norm_eps=float(_required(reader, path, f"{arch}.attention.layer_norm_rms_epsilon")),
        qkv_bias="layers.0.attn.q_bias" in names,
        rope={"theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
              "rotary_dim": int(_field(reader, f"{arch}.rope.dimension_count", head_dim)),
              "pairing": _ROPE_PAIRING[arch], "mrope_section": None},
        tie_word_embeddings="lm_head" not in names,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 4096)),
        bos_token_id=bos_id,
        eos_token_ids=eos_ids,
    )
    if _field(reader, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ConversionError(f"{path}: RoPE scaling is not supported yet")
    return Source(
        kind="gguf",
        path=path.resolve(),
        architecture=arch,
        config=config,
        tensors=tensors,
        tokenizer_json=_tokenizer(reader, path),
        chat_template=_field(reader, "tokenizer.chat_template"),
        special_tokens={"bos": bos_id, "eos": eos_ids, "pad": None if pad is None else int(pad)},
    )
