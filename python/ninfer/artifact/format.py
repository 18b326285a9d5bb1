"""The fixed parts of the `.ninfer` v3 layout (docs/artifact-format.md): header, alignments, checksums.

Shared by the writer and the reader so that both read the one definition of every byte.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

# The architectures an artifact's config may name (`arch`): the converters write them, the reader refuses others.
QWEN35_FAMILY = ("qwen3_5", "qwen3_5_moe")
PLAIN_DECODERS = ("llama", "qwen2", "qwen3")
SUPPORTED_ARCHITECTURES = (*QWEN35_FAMILY, *PLAIN_DECODERS)

MAGIC = b"NINFER\x00\x1a"
VERSION = 3
HEADER_SIZE = 64
MANIFEST_OFFSET = HEADER_SIZE
DATA_ALIGNMENT = 4096
BLOB_ALIGNMENT = 64
# Written in place of every blob checksum while the tensors stream in; the final value has the same width,
# so filling the checksums never moves the data.
CRC_PLACEHOLDER = "00000000"

# magic, version, flags, manifest_offset, manifest_size, data_offset, data_size, manifest_crc32, reserved
_HEADER = struct.Struct("<8sIIQQQQI12s")
assert _HEADER.size == HEADER_SIZE


@dataclass(frozen=True)
class Header:
    """The 64-byte header, field for field. Unpacking does not validate (the reader does, naming the file)."""

    magic: bytes
    version: int
    flags: int
    manifest_offset: int
    manifest_size: int
    data_offset: int
    data_size: int
    manifest_crc32: int
    reserved: bytes = bytes(12)

    def pack(self) -> bytes:
        return _HEADER.pack(
            self.magic,
            self.version,
            self.flags,
            self.manifest_offset,
            self.manifest_size,
            self.data_offset,
            self.data_size,
            self.manifest_crc32,
            self.reserved,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> Header:
        return cls(*_HEADER.unpack(raw[:HEADER_SIZE]))


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def crc32_hex(crc: int) -> str:
    """A CRC-32 as the manifest writes it: exactly 8 lowercase hex digits."""
    return f"{crc & 0xFFFFFFFF:08x}"


def crc32(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def manifest_bytes(manifest: dict) -> bytes:
    """Compact UTF-8 JSON: the manifest carries a multi-megabyte tokenizer, so no indentation."""
    return json.dumps(manifest, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
