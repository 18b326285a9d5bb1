"""Small `.ninfer` files for the reader and kernel tests: written by the real writer, then (for the refusal
tests) edited in place at the byte level the way corruption would, with the header re-sealed where a test wants
to get past the manifest checks."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from ninfer.artifact.encodings import encode
from ninfer.artifact.format import HEADER_SIZE, Header, manifest_bytes
from ninfer.artifact.writer import ArtifactWriter, TensorPlan

CONFIG = {"arch": "llama", "vocab_size": 8, "hidden_size": 8, "num_layers": 0}
FRONTEND = {"tokenizer_json": "{}", "chat_templates": {}, "generation_defaults": {}, "preprocessing": {},
            "special_tokens": {"bos": None, "eos": [], "pad": None}}


def write_artifact(path: Path, tensors: dict[str, tuple[str, int | None, dict[str, np.ndarray]]]) -> Path:
    """Writes `name -> (encoding, group_size, blobs)` with already-encoded blobs (so tests control every code)."""
    plans = []
    for name, (encoding, group_size, blobs) in tensors.items():
        shape = shape_of(encoding, blobs)
        plans.append(TensorPlan(name, shape, encoding, group_size))
    with ArtifactWriter(path, config=CONFIG, tensors=plans, frontend=FRONTEND, recipe={"name": "test", "rules": []},
                        source={"kind": "synthetic", "path": "", "architecture": "llama"}, progress=False) as w:
        for name, (_, _, blobs) in tensors.items():
            w.write_encoded(name, blobs)
    return path


def shape_of(encoding: str, blobs: dict[str, np.ndarray]) -> tuple[int, ...]:
    if "data" in blobs:
        return tuple(blobs["data"].shape)
    q = blobs["q"].shape
    return q if encoding in ("fp8_e4m3", "int8") else q[:-1] + (q[-1] * 2,)


def encoded(values: np.ndarray, encoding: str, group_size: int | None = None):
    """The (encoding, group_size, blobs) triple of real values through the Python encoder."""
    return encoding, group_size, encode(values, encoding, group_size)


def random_codes(rng: np.random.Generator, encoding: str, shape: tuple[int, ...], group_size: int | None = None,
                 nan_codes: bool = True):
    """Blobs of arbitrary codes: every code and scale value a kernel may meet, not only what the encoder emits.
    With nan_codes=False the e4m3 NaN codes (0x7f, 0xff) are left out, so products stay finite."""
    lead, cols = shape[:-1], shape[-1]

    def u8(*dims: int) -> np.ndarray:
        codes = rng.integers(0, 256, dims, dtype=np.uint8)
        if not nan_codes:
            codes[(codes & 0x7F) == 0x7F] -= 1
        return codes

    if encoding == "f32":
        return encoding, None, {"data": rng.standard_normal(shape).astype(np.float32)}
    if encoding == "f16":
        return encoding, None, {"data": rng.standard_normal(shape).astype(np.float16)}
    if encoding == "bf16":
        bits = rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16
        return encoding, None, {"data": bits.astype(np.uint16)}
    if encoding == "fp8_e4m3":
        scale = rng.uniform(0.001, 0.1, lead).astype(np.float32)
        return encoding, None, {"q": u8(*shape), "scale": scale}
    if encoding in ("int8", "int4"):
        groups = lead + (cols // group_size,)
        qmax = 255 if encoding == "int8" else 15
        scale = rng.uniform(1e-4, 0.05, groups).astype(np.float16)
        zero = rng.integers(0, qmax + 1, groups, dtype=np.uint8)
        q = u8(*lead, cols) if encoding == "int8" else u8(*lead, cols // 2)
        return encoding, group_size, {"q": q, "scale": scale, "zero": zero}
    if encoding == "int4_affine":
        groups = lead + (cols // group_size,)
        scale = rng.uniform(1e-4, 0.05, groups).astype(np.float16)
        offset = rng.uniform(-0.5, 0.1, groups).astype(np.float16)
        return encoding, group_size, {"q": u8(*lead, cols // 2), "scale": scale, "offset": offset}
    if encoding == "nvfp4":
        return encoding, None, {"q": u8(*lead, cols // 2), "scale": u8(*lead, cols // 16),
                                "global_scale": np.array([rng.uniform(0.01, 2.0)], dtype=np.float32)}
    raise ValueError(encoding)


# --- byte-level edits -----------------------------------------------------------------------------------------


def weight_pairs_artifact(path: Path, cases: list[tuple[str, str, int | None, tuple[int, ...]]],
                          rng: np.random.Generator) -> tuple[Path, dict[str, np.ndarray]]:
    """An artifact with two weights per case (name, encoding, group, shape): "codes/<name>", random codes (no NaN
    codes), and "real/<name>", standard-normal values encoded. Returns its path and each weight's decoded values."""
    from ninfer.artifact.encodings import decode

    tensors = {}
    for name, encoding, group, shape in cases:
        tensors["codes/" + name] = random_codes(rng, encoding, shape, group, nan_codes=False)
        tensors["real/" + name] = encoded(rng.standard_normal(shape).astype(np.float32), encoding, group)
    reference = {name: decode(blobs, enc, shape_of(enc, blobs), group) for name, (enc, group, blobs) in tensors.items()}
    return write_artifact(path, tensors), reference


def read_header(path: Path) -> Header:
    return Header.unpack(path.read_bytes()[:HEADER_SIZE])


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def set_version(path: Path, version: int) -> None:
    patch(path, 8, struct.pack("<I", version))


def rewrite_manifest(path: Path, edit: Callable[[dict], None] | None = None, text: bytes | None = None) -> None:
    """Replaces the manifest (edited as a dict, or raw bytes) and re-seals the header's size and CRC, so the
    reader gets past the manifest checks and meets the edit itself. The new manifest must fit before data."""
    header = read_header(path)
    raw = path.read_bytes()
    if text is None:
        manifest = json.loads(raw[HEADER_SIZE:HEADER_SIZE + header.manifest_size])
        edit(manifest)
        text = manifest_bytes(manifest)
    assert HEADER_SIZE + len(text) <= header.data_offset, "edited manifest does not fit"
    patch(path, HEADER_SIZE, text + bytes(header.data_offset - HEADER_SIZE - len(text)))
    patch(path, 0, Header(header.magic, header.version, header.flags, header.manifest_offset, len(text),
                          header.data_offset, header.data_size, zlib.crc32(text)).pack())


def tensor_entry(manifest: dict, name: str) -> dict:
    return next(entry for entry in manifest["tensors"] if entry["name"] == name)
