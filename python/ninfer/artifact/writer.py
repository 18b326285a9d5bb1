"""Streaming `.ninfer` v3 writer: the layout is fixed from the plan, tensors arrive in any order, and the
file appears under its final name only once it is complete (written to `<path>.partial`, fsynced, renamed)."""

from __future__ import annotations

import dataclasses
import operator
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
from tqdm import tqdm

from ninfer.artifact.encodings import GROUPED_ENCODINGS, BlobSpec, blob_specs, encode_chunks, encoding_problem
from ninfer.artifact.format import (
    BLOB_ALIGNMENT,
    CRC_PLACEHOLDER,
    DATA_ALIGNMENT,
    MAGIC,
    MANIFEST_OFFSET,
    VERSION,
    Header,
    align_up,
    crc32,
    crc32_hex,
    manifest_bytes,
)
from ninfer.errors import ArtifactError


@dataclass(frozen=True)
class TensorPlan:
    """One tensor the artifact will hold: its logical name, shape and encoding (group_size for int8/int4)."""

    name: str
    shape: tuple[int, ...]
    encoding: str
    group_size: int | None = None


@dataclass
class _PlacedBlob:
    spec: BlobSpec
    offset: int  # relative to data_offset
    crc: int = 0
    written: int = 0  # bytes so far; pieces of a blob arrive in order


class ArtifactWriter:
    """Writes one artifact. As a context manager: commit on success, abort (no file left) on an exception."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        config: dict,
        tensors: list[TensorPlan],
        frontend: dict,
        recipe: dict,
        source: dict,
        progress: bool = True,
    ) -> None:
        self.path = Path(path)
        self._partial = Path(f"{self.path}.partial")
        self._plans: dict[str, TensorPlan] = {}
        self._blobs: dict[str, dict[str, _PlacedBlob]] = {}
        self._written: set[str] = set()
        data_size = self._place(tensors)
        self._manifest = {
            "format": "ninfer",
            "version": VERSION,
            "config": config,
            "tensors": [self._tensor_entry(plan.name) for plan in tensors],
            "frontend": frontend,
            "recipe": recipe,
            "source": source,
        }
        try:
            manifest_size = len(manifest_bytes(self._manifest))
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{self.path}: the manifest is not JSON-serialisable: {exc}") from exc
        self._header = Header(
            MAGIC,
            VERSION,
            0,
            MANIFEST_OFFSET,
            manifest_size,
            align_up(MANIFEST_OFFSET + manifest_size, DATA_ALIGNMENT),
            data_size,
            0,
        )
        self._file = open(self._partial, "w+b")  # noqa: SIM115 -- held until commit/abort
        self._file.truncate(self._header.data_offset + data_size)
        self._progress = tqdm(
            total=data_size,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=self.path.name,
            disable=not progress,
        )

    def _place(self, tensors: list[TensorPlan]) -> int:
        """Assigns every blob its 64-byte aligned offset, in plan order; returns the data size."""
        end = 0
        for plan in tensors:
            try:
                plan = TensorPlan(
                    plan.name, tuple(operator.index(d) for d in plan.shape), plan.encoding, plan.group_size
                )
            except TypeError as exc:
                raise ArtifactError(f"{self.path}: tensor {plan.name!r} has a non-integer shape") from exc
            if plan.name in self._plans:
                raise ArtifactError(f"{self.path}: tensor {plan.name!r} is planned twice")
            problem = encoding_problem(plan.encoding, plan.shape, plan.group_size)
            if problem:
                raise ArtifactError(f"{self.path}: tensor {plan.name!r} cannot be written: {problem}")
            self._plans[plan.name] = plan
            placed = {}
            for blob_name, spec in blob_specs(plan.encoding, plan.shape, plan.group_size).items():
                offset = align_up(end, BLOB_ALIGNMENT)
                placed[blob_name] = _PlacedBlob(spec, offset)
                end = offset + spec.nbytes
            self._blobs[plan.name] = placed
        return end

    def _tensor_entry(self, name: str) -> dict:
        plan = self._plans[name]
        entry: dict = {"name": name, "encoding": plan.encoding, "shape": list(plan.shape)}
        if plan.encoding in GROUPED_ENCODINGS:
            entry["group_size"] = plan.group_size
        entry["blobs"] = {
            blob_name: {
                "offset": blob.offset,
                "nbytes": blob.spec.nbytes,
                "crc32": crc32_hex(blob.crc) if name in self._written else CRC_PLACEHOLDER,
            }
            for blob_name, blob in self._blobs[name].items()
        }
        return entry

    # --- tensors ------------------------------------------------------------------------------------------

    def _claim(self, name: str) -> dict[str, _PlacedBlob]:
        if name not in self._plans:
            raise ArtifactError(f"{self.path}: tensor {name!r} is not in the plan")
        if name in self._written:
            raise ArtifactError(f"{self.path}: tensor {name!r} is written twice")
        return self._blobs[name]

    def _append(self, name: str, blob_name: str, blob: _PlacedBlob, data: bytes | memoryview) -> None:
        if blob.written + len(data) > blob.spec.nbytes:
            raise ArtifactError(
                f"{self.path}: tensor {name!r} blob {blob_name!r} overflows its {blob.spec.nbytes} bytes"
            )
        self._file.seek(self._header.data_offset + blob.offset + blob.written)
        self._file.write(data)
        blob.crc = zlib.crc32(data, blob.crc)
        blob.written += len(data)
        self._progress.update(len(data))

    def _finish(self, name: str, blobs: dict[str, _PlacedBlob]) -> None:
        for blob_name, blob in blobs.items():
            if blob.written != blob.spec.nbytes:
                raise ArtifactError(
                    f"{self.path}: tensor {name!r} blob {blob_name!r} got {blob.written} bytes, "
                    f"expected {blob.spec.nbytes}"
                )
        self._written.add(name)

    def write(self, name: str, values: np.ndarray) -> None:
        """Encodes a float array of the planned shape per its plan and writes it."""
        blobs = self._claim(name)
        plan = self._plans[name]
        values = np.asarray(values)
        if values.shape != plan.shape:
            raise ArtifactError(
                f"{self.path}: tensor {name!r} has shape {list(values.shape)}, planned {list(plan.shape)}"
            )
        for pieces in encode_chunks(values, plan.encoding, plan.group_size):
            for blob_name, piece in pieces.items():
                piece = np.ascontiguousarray(piece, dtype=blobs[blob_name].spec.dtype)
                self._append(name, blob_name, blobs[blob_name], memoryview(piece).cast("B"))
        self._finish(name, blobs)

    def write_encoded(self, name: str, blobs: dict[str, np.ndarray | bytes]) -> None:
        """Writes pre-encoded blobs (e.g. synthetic benchmark weights); each must match its spec exactly."""
        placed = self._claim(name)
        if set(blobs) != set(placed):
            raise ArtifactError(
                f"{self.path}: tensor {name!r} needs blobs {sorted(placed)}, got {sorted(blobs)}"
            )
        for blob_name, blob in placed.items():
            data = blobs[blob_name]
            if isinstance(data, np.ndarray):
                if data.dtype != blob.spec.dtype or data.shape != blob.spec.shape:
                    raise ArtifactError(
                        f"{self.path}: tensor {name!r} blob {blob_name!r} is {data.dtype}{list(data.shape)}, "
                        f"expected {blob.spec.dtype}{list(blob.spec.shape)}"
                    )
                data = memoryview(np.ascontiguousarray(data)).cast("B")
            self._append(name, blob_name, blob, data)
        self._finish(name, placed)

    # --- completion ---------------------------------------------------------------------------------------

    def commit(self) -> None:
        missing = [name for name in self._plans if name not in self._written]
        if missing:
            raise ArtifactError(
                f"{self.path}: {len(missing)} planned tensor(s) never written: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )
        self._manifest["tensors"] = [self._tensor_entry(name) for name in self._plans]
        manifest = manifest_bytes(self._manifest)
        # The checksums have the placeholders' width, so the manifest keeps the size the layout was built on.
        assert len(manifest) == self._header.manifest_size
        header = dataclasses.replace(self._header, manifest_crc32=crc32(manifest))
        self._file.seek(0)
        self._file.write(header.pack())
        self._file.write(manifest)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._close()
        os.replace(self._partial, self.path)
        _fsync_directory(self.path.parent)

    def abort(self) -> None:
        self._close()
        self._partial.unlink(missing_ok=True)

    def _close(self) -> None:
        self._progress.close()
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def _fsync_directory(directory: Path) -> None:
    """Makes the rename durable (the new directory entry), where the platform allows opening a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
