"""Pure-Python `.ninfer` v3 reader: validates the header and manifest (docs/artifact-format.md, "What a reader
refuses") and maps blobs on demand. Used by `ninfer inspect` and the frontend (tokenizer, templates)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import mmap
import os
import re
import zlib
from pathlib import Path
from typing import Any, Self

import numpy as np

from ninfer.artifact.encodings import ENCODINGS, GROUPED_ENCODINGS, BlobSpec, blob_specs, encoding_problem
from ninfer.artifact.format import (
    BLOB_ALIGNMENT,
    DATA_ALIGNMENT,
    HEADER_SIZE,
    MAGIC,
    MANIFEST_OFFSET,
    SUPPORTED_ARCHITECTURES,
    VERSION,
    Header,
)
from ninfer.errors import ArtifactError

_CRC_HEX = re.compile(r"[0-9a-f]{8}")
_CRC_STEP = 1 << 26  # checksum big blobs a slice at a time


class ArtifactInfo:
    """A validated artifact: the manifest's sections, and its blobs mapped read-only on request."""

    def __init__(
        self, path: Path, header: Header, manifest: dict, blob_specs_by_tensor: dict[str, dict[str, BlobSpec]]
    ) -> None:
        self.path = path
        self.version: int = header.version
        self.config: dict = manifest["config"]
        self.tensors: list[dict] = manifest["tensors"]
        self.frontend: dict = manifest["frontend"]
        self.recipe: dict = manifest["recipe"]
        self.source: dict = manifest["source"]
        self.manifest = manifest
        self.data_offset = header.data_offset
        self.data_size = header.data_size
        self._by_name = {entry["name"]: entry for entry in self.tensors}
        self._specs = blob_specs_by_tensor
        self._map: mmap.mmap | None = None

    def tensor(self, name: str, expected_shape: tuple[int, ...] | None = None) -> dict:
        """A tensor's manifest entry; refuses one that is missing or (when given) of another shape."""
        entry = self._by_name.get(name)
        if entry is None:
            raise ArtifactError(f"{self.path}: tensor {name!r} is missing")
        if expected_shape is not None and tuple(entry["shape"]) != tuple(expected_shape):
            raise ArtifactError(
                f"{self.path}: tensor {name!r} has shape {entry['shape']}, expected {list(expected_shape)}"
            )
        return entry

    def tensor_bytes(self, name: str) -> dict[str, np.ndarray]:
        """The tensor's blobs as read-only arrays over the mapping (per encoding; bf16 as uint16)."""
        entry = self.tensor(name)
        mapping = self._mapping()
        return {
            blob_name: np.frombuffer(
                mapping,
                dtype=spec.dtype,
                count=math.prod(spec.shape),
                offset=self.data_offset + entry["blobs"][blob_name]["offset"],
            ).reshape(spec.shape)
            for blob_name, spec in self._specs[name].items()
        }

    def verify_checksums(self) -> None:
        """Recomputes every blob's CRC-32; refuses the first mismatch."""
        with memoryview(self._mapping()) as view:
            for entry in self.tensors:
                for blob_name, blob in entry["blobs"].items():
                    start = self.data_offset + blob["offset"]
                    crc = 0
                    for at in range(start, start + blob["nbytes"], _CRC_STEP):
                        with view[at : min(at + _CRC_STEP, start + blob["nbytes"])] as piece:
                            crc = zlib.crc32(piece, crc)
                    if f"{crc:08x}" != blob["crc32"]:
                        raise ArtifactError(
                            f"{self.path}: checksum mismatch in tensor {entry['name']!r} blob "
                            f"{blob_name!r} (manifest {blob['crc32']}, data {crc:08x})"
                        )

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map

    def close(self) -> None:
        """Unmaps the file; arrays still alive from tensor_bytes keep the mapping until they are dropped."""
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_artifact(path: str | os.PathLike, verify_checksums: bool = False) -> ArtifactInfo:
    """Opens and validates an artifact; every refusal is an ArtifactError naming the file and the problem."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = _read_header(path, f.read(HEADER_SIZE), size)
            f.seek(header.manifest_offset)
            raw_manifest = f.read(header.manifest_size)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if zlib.crc32(raw_manifest) != header.manifest_crc32:
        raise ArtifactError(
            f"{path}: manifest CRC mismatch (header {header.manifest_crc32:08x}, "
            f"manifest {zlib.crc32(raw_manifest):08x}): the file is corrupt"
        )
    manifest = _parse_manifest(path, raw_manifest)
    specs = _check_tensors(path, manifest["tensors"], header.data_size)
    info = ArtifactInfo(path, header, manifest, specs)
    if verify_checksums:
        try:
            info.verify_checksums()
        except ArtifactError:
            info.close()
            raise
    return info


def _read_header(path: Path, raw: bytes, size: int) -> Header:
    if len(raw) < HEADER_SIZE:
        raise ArtifactError(f"{path}: truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte header")
    header = Header.unpack(raw)
    if header.magic != MAGIC:
        raise ArtifactError(f"{path}: wrong magic {header.magic!r}: not a .ninfer artifact")
    if header.version != VERSION:
        raise ArtifactError(
            f"{path}: format version {header.version}, this reader reads version {VERSION} "
            "only: convert the model again with this ninfer (there is no in-place upgrade yet)"
        )
    if header.flags != 0:
        raise ArtifactError(f"{path}: unknown header flags {header.flags:#x}")
    if any(header.reserved):
        raise ArtifactError(f"{path}: the header's reserved bytes are not zero ({header.reserved.hex()}): written "
                            "by a newer or broken writer")
    if header.manifest_offset != MANIFEST_OFFSET:
        raise ArtifactError(
            f"{path}: manifest_offset is {header.manifest_offset}, expected {MANIFEST_OFFSET}"
        )
    if header.data_offset % DATA_ALIGNMENT:
        raise ArtifactError(f"{path}: data_offset {header.data_offset} is not a multiple of {DATA_ALIGNMENT}")
    if header.data_offset < MANIFEST_OFFSET + header.manifest_size:
        raise ArtifactError(
            f"{path}: data_offset {header.data_offset} is inside the {header.manifest_size}-byte manifest "
            f"(which ends at byte {MANIFEST_OFFSET + header.manifest_size})"
        )
    expected = header.data_offset + header.data_size
    if size < expected:
        raise ArtifactError(f"{path}: truncated: {size} bytes, the header says {expected}")
    if size > expected:
        raise ArtifactError(f"{path}: {size - expected} unexpected bytes after the data region")
    return header


def _parse_manifest(path: Path, raw: bytes) -> dict:
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: the manifest is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: the manifest is not a JSON object")
    if manifest.get("format") != "ninfer" or manifest.get("version") != VERSION:
        raise ArtifactError(
            f"{path}: the manifest says format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}, expected 'ninfer' version {VERSION}"
        )
    for section in ("config", "frontend", "recipe", "source"):
        if not isinstance(manifest.get(section), dict):
            raise ArtifactError(f"{path}: manifest section {section!r} is missing or not an object")
    if not isinstance(manifest.get("tensors"), list):
        raise ArtifactError(f"{path}: manifest section 'tensors' is missing or not a list")
    _check_model_identity(path, manifest["config"], manifest["frontend"])
    return manifest


def _check_model_identity(path: Path, config: dict, frontend: dict) -> None:
    """The architecture is one this build runs, and every special token id the config and frontend name is a token
    of the vocabulary (an end-of-sequence id outside it would never stop a generation)."""
    arch = config.get("arch")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ArtifactError(f"{path}: config.arch {arch!r} is not an architecture this build runs "
                            f"({', '.join(SUPPORTED_ARCHITECTURES)})")
    vocab = config.get("vocab_size")
    if vocab is None:
        return  # a format-only artifact (no model): the engine refuses it by the missing size when it loads one
    if not _is_count(vocab) or vocab == 0:
        raise ArtifactError(f"{path}: config.vocab_size must be a positive integer, got {vocab!r}")
    special = frontend.get("special_tokens") or {}
    named = [("config.bos_token_id", config.get("bos_token_id")),
             *((f"config.eos_token_ids[{i}]", t) for i, t in enumerate(_as_list(config.get("eos_token_ids")))),
             ("frontend.special_tokens.bos", special.get("bos") if isinstance(special, dict) else None),
             ("frontend.special_tokens.pad", special.get("pad") if isinstance(special, dict) else None),
             *((f"frontend.special_tokens.eos[{i}]", t)
               for i, t in enumerate(_as_list(special.get("eos") if isinstance(special, dict) else None)))]
    for where, token in named:
        if token is not None and not (_is_count(token) and token < vocab):
            raise ArtifactError(f"{path}: {where} is {token!r}, not a token id of the {vocab}-token vocabulary")


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tensors(path: Path, tensors: list, data_size: int) -> dict[str, dict[str, BlobSpec]]:
    """Validates every tensor entry and blob placement; returns each tensor's blob specs."""
    specs: dict[str, dict[str, BlobSpec]] = {}
    extents: list[tuple[int, int, str]] = []
    for index, entry in enumerate(tensors):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ArtifactError(f"{path}: tensor entry {index} has no name")
        name = entry["name"]
        where = f"{path}: tensor {name!r}"
        if name in specs:
            raise ArtifactError(f"{where} appears twice")
        encoding, shape = entry.get("encoding"), entry.get("shape")
        if encoding not in ENCODINGS:
            raise ArtifactError(f"{where}: unknown encoding {encoding!r} (known: {', '.join(ENCODINGS)})")
        if not isinstance(shape, list):
            raise ArtifactError(f"{where}: shape {shape!r} is not a list")
        group_size = entry.get("group_size") if encoding in GROUPED_ENCODINGS else None
        problem = encoding_problem(encoding, shape, group_size)
        if problem:
            raise ArtifactError(f"{where}: {problem}")
        specs[name] = blob_specs(encoding, shape, group_size)
        blobs = entry.get("blobs")
        if not isinstance(blobs, dict) or set(blobs) != set(specs[name]):
            found = sorted(blobs) if isinstance(blobs, dict) else blobs
            raise ArtifactError(
                f"{where}: {encoding} needs blobs {sorted(specs[name])}, the manifest has {found}"
            )
        for blob_name, spec in specs[name].items():
            blob = blobs[blob_name]
            label = f"{where} blob {blob_name!r}"
            if (
                not isinstance(blob, dict)
                or not _is_count(blob.get("offset"))
                or not _is_count(blob.get("nbytes"))
            ):
                raise ArtifactError(f"{label}: offset and nbytes must be non-negative integers")
            if not isinstance(blob.get("crc32"), str) or not _CRC_HEX.fullmatch(blob["crc32"]):
                raise ArtifactError(
                    f"{label}: crc32 must be 8 lowercase hex digits, not {blob.get('crc32')!r}"
                )
            offset, nbytes = blob["offset"], blob["nbytes"]
            if nbytes != spec.nbytes:
                raise ArtifactError(
                    f"{label}: size {nbytes} bytes does not match shape {shape} as {encoding} "
                    f"({spec.nbytes} bytes)"
                )
            if offset % BLOB_ALIGNMENT:
                raise ArtifactError(f"{label}: offset {offset} is not a multiple of {BLOB_ALIGNMENT}")
            if offset + nbytes > data_size:
                raise ArtifactError(
                    f"{label}: bytes {offset}..{offset + nbytes} lie outside the {data_size}-byte data region"
                )
            extents.append((offset, offset + nbytes, f"{name}/{blob_name}"))
    extents.sort()
    for (_, end, first), (start, _, second) in itertools.pairwise(extents):
        if start < end:
            raise ArtifactError(f"{path}: blobs {first} and {second} overlap")
    return specs
