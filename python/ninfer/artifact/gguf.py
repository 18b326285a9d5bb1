"""GGUF file (arch `llama`, `qwen2`, or Qwen3.5's `qwen35` / `qwen35moe`: gguf_qwen35.py) -> `Source`, through the
PyPI `gguf` package.

Float tensors are read as float32 and encoded per the recipe. Quantised ones keep their blocks where an artifact
encoding holds them exactly (gguf_blocks.py); the rest are dequantized by `gguf.quants.dequantize` and re-encoded. Q/K of GGUF `llama` are kept exactly as stored: llama.cpp's converter permutes their rows so that RoPE
rotates adjacent pairs (2j, 2j+1), so the artifact says `rope.pairing = "interleaved"` instead of undoing the
permutation. (`qwen2` GGUFs are not permuted: llama.cpp runs them with NeoX pairing, `"half"`.)
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ninfer.artifact.convert import Source, SourceTensor, decoder_config, unsupported_architecture
from ninfer.artifact.gguf_blocks import native_tensor
from ninfer.artifact.gguf_file import ATTENTION_NAMES, TOP_NAMES, GGUFFile
from ninfer.artifact.gguf_qwen35 import QWEN35_GGUF_ARCHS, map_tensors, qwen35_config, qwen35_source
from ninfer.artifact.sampling_source import gguf_sampling_defaults
from ninfer.artifact.tokenizer_build import gguf_tokenizer_json
from ninfer.errors import ConversionError

_ROPE_PAIRING = {"llama": "interleaved", "qwen2": "half"}
_BLOCK_NAMES = {
    **ATTENTION_NAMES,
    "ffn_norm.weight": "post_attn_norm",
    "attn_q.bias": "attn.q_bias",
    "attn_k.bias": "attn.k_bias",
    "attn_v.bias": "attn.v_bias",
    "ffn_gate.weight": "mlp.gate",
    "ffn_up.weight": "mlp.up",
    "ffn_down.weight": "mlp.down",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def _field(reader: GGUFFile, key: str, default: object = None) -> object:
    return reader.fields.get(key, default)


def _required(reader, path: Path, key: str) -> object:
    value = _field(reader, key)
    if value is None:
        raise ConversionError(f"{path}: GGUF metadata lacks {key}")
    return value


def _sampling(reader: GGUFFile, path: Path) -> dict:
    return gguf_sampling_defaults(lambda key: _field(reader, key), str(path))


def logical_name(name: str) -> str | None:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
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


def _file_tensor(tensor) -> SourceTensor:
    """A GGUF tensor under its own name, in row-major shape (GGUF lists dimensions fastest-first)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return SourceTensor(tensor.name, shape, _loader(tensor), native_tensor(tensor.tensor_type.name, tensor.data, shape))


def _tensors(reader, path: Path) -> list[SourceTensor]:
    tensors, unknown = [], []
    for tensor in reader.tensors:
        logical = logical_name(tensor.name)
        if logical is None:
            unknown.append(tensor.name)
            continue
        read = _file_tensor(tensor)
        tensors.append(SourceTensor(logical, read.shape, read.load, read.native))
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


# What numpy or gguf's dequantizer may raise on corrupt data the header checks cannot see (a block's bytes, read
# only when the tensor is): turned into one ConversionError naming the file, never a traceback.
_MALFORMED = (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError, struct.error,
              AttributeError, ZeroDivisionError)


def open_gguf_file(path: Path) -> Source:
    """The GGUF file as a Source; a truncated or corrupt file is a ConversionError naming the file."""
    try:
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
    reader = GGUFFile(path)
    arch = str(_required(reader, path, "general.architecture"))
    if arch in QWEN35_GGUF_ARCHS:
        return _open_qwen35(reader, path, arch)
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
        generation_defaults=_sampling(reader, path),
        special_tokens={"bos": bos_id, "eos": eos_ids, "pad": None if pad is None else int(pad)},
    )


def _open_qwen35(reader, path: Path, arch: str) -> Source:
    """A `qwen35` / `qwen35moe` file (gguf_qwen35.py undoes llama.cpp's value transforms)."""
    named = [(tensor.name, _file_tensor(tensor)) for tensor in reader.tensors]
    shapes = dict(named)
    if "token_embd.weight" not in shapes:
        raise ConversionError(f"{path}: GGUF has no token_embd.weight")
    config, num_layers = qwen35_config(
        arch, lambda key, default: _field(reader, key, default), lambda key: _required(reader, path, key),
        vocab_size=shapes["token_embd.weight"].shape[0], tie="output.weight" not in shapes)
    if _field(reader, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ConversionError(f"{path}: RoPE scaling is not supported yet")
    tensors = map_tensors(named, config, num_layers, path)
    return qwen35_source(path, arch, config, tensors, eos=_field(reader, "tokenizer.ggml.eos_token_id"),
                         pad=_field(reader, "tokenizer.ggml.padding_token_id"),
                         tokenizer_json=_tokenizer(reader, path), chat_template=_field(reader, "tokenizer.chat_template"),
                         generation_defaults=_sampling(reader, path))
