"""The C++ artifact reader (`_engine.Artifact`): exact dequantization against the Python reference decoder for
every encoding, and every refusal of docs/artifact-format.md as an ArtifactError naming the file and the problem."""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from artifact_files import (
    encoded,
    patch,
    random_codes,
    read_header,
    rewrite_manifest,
    set_version,
    tensor_entry,
    write_artifact,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ninfer import _engine, _testing
from ninfer.artifact.encodings import decode
from ninfer.artifact.format import Header
from ninfer.artifact.reader import read_artifact
from ninfer.errors import ArtifactError

# (encoding, group_size, shape): odd row counts, 3-D stacks, every group size, odd columns where allowed.
CASES = [
    ("f32", None, (5, 37)),
    ("f16", None, (3, 2, 19)),
    ("bf16", None, (7, 33)),
    ("bf16", None, (11,)),
    ("fp8_e4m3", None, (9, 41)),
    ("fp8_e4m3", None, (2, 3, 24)),
    ("int8", 32, (5, 96)),
    ("int8", 64, (3, 5, 128)),
    ("int8", 128, (7, 256)),
    ("int4", 32, (9, 64)),
    ("int4", 64, (2, 7, 192)),
    ("int4", 128, (5, 384)),
    ("int4_affine", 32, (2, 3, 64)),
    ("nvfp4", None, (7, 48)),
    ("nvfp4", None, (3, 5, 32)),
]


def case_id(case: tuple) -> str:
    encoding, group, shape = case
    return f"{encoding}{'-g' + str(group) if group else ''}-{'x'.join(map(str, shape))}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dequantize_equals_python_reference_exactly(tmp_path: Path, case: tuple) -> None:
    encoding, group, shape = case
    rng = np.random.default_rng(abs(hash(case_id(case))) % 2**32)
    # Arbitrary codes (every e4m3 / e2m1 / nibble value, NaN codes included) and real encoder output.
    arbitrary = random_codes(rng, encoding, shape, group)
    real = encoded(rng.standard_normal(shape).astype(np.float32) * 3, encoding, group)
    path = write_artifact(tmp_path / "t.ninfer", {"arbitrary": arbitrary, "real": real})
    with _engine.Artifact.open(path) as art:
        for name, (_, _, blobs) in {"arbitrary": arbitrary, "real": real}.items():
            expected = decode(blobs, encoding, shape, group)
            got = art.dequantize(name)
            assert got.dtype == np.float32 and got.shape == shape
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} {encoding}")
            rows = expected.reshape(-1, shape[-1])
            for row in (0, rows.shape[0] // 2, rows.shape[0] - 1):
                np.testing.assert_array_equal(_testing.kernels.dequantize_row(art, name, row), rows[row])
            info = art.tensor_info(name)
            assert info == {"encoding": encoding, "shape": shape,
                            "group_size": group if group else (16 if encoding == "nvfp4" else None)}


def test_metadata_and_close(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = write_artifact(tmp_path / "meta.ninfer",
                          {"b": random_codes(rng, "bf16", (2, 4)), "a": random_codes(rng, "int4", (4, 64), 32)})
    art = _engine.Artifact.open(str(path))
    assert art.path == str(path)
    assert art.tensor_names() == ["a", "b"]
    assert art.file_size == path.stat().st_size
    manifest = json.loads(art.manifest_json())
    assert manifest["format"] == "ninfer" and [t["name"] for t in manifest["tensors"]] == ["b", "a"]
    art.close()
    assert art.closed
    with pytest.raises(ArtifactError, match="closed"):
        art.tensor_names()


def test_json_manifest_unicode_and_escapes(tmp_path: Path) -> None:
    """The manifest parser keeps strings exactly (tokenizers carry every kind of character)."""
    path = write_artifact(tmp_path / "u.ninfer", {"w": random_codes(np.random.default_rng(1), "f32", (1, 2))})
    weird = "tab\t quote\" backslash\\ nul\u0000 é 漢 🙂 \ud7ff"

    def add(manifest: dict) -> None:
        manifest["frontend"]["chat_templates"] = {"default": weird}

    rewrite_manifest(path, add)
    with _engine.Artifact.open(path) as art:
        assert json.loads(art.manifest_json())["frontend"]["chat_templates"]["default"] == weird
    # \u escapes, surrogate pairs, numbers in every JSON form: the C++ parser must accept what json.dumps writes.
    text = json.dumps(json.loads(path.read_bytes()[64:64 + read_header(path).manifest_size]), ensure_ascii=True)
    text = text.replace('"tensors"', '"n": [0, -0.5, 1e3, 2E-2, -1.25e+2, 123456789012], "tensors"', 1)
    rewrite_manifest(path, text=text.encode())
    with _engine.Artifact.open(path) as art:
        assert json.loads(art.manifest_json())["frontend"]["chat_templates"]["default"] == weird


# --- refusals -------------------------------------------------------------------------------------------------


@pytest.fixture
def valid(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    return write_artifact(tmp_path / "model.ninfer", {
        "w": random_codes(rng, "int4", (8, 64), 32),
        "v": random_codes(rng, "bf16", (4, 16)),
    })


def refused(path: Path, problem: str, verify_checksums: bool = True) -> str:
    with pytest.raises(ArtifactError) as info:
        _engine.Artifact.open(path, verify_checksums=verify_checksums)
    message = str(info.value)
    assert str(path) in message, message
    assert problem in message, message
    return message


def test_valid_artifact_opens(valid: Path) -> None:
    with _engine.Artifact.open(valid) as art:
        assert art.tensor_names() == ["v", "w"]


def test_wrong_magic(valid: Path) -> None:
    patch(valid, 0, b"GGUF\x00\x00\x00\x00")
    refused(valid, "wrong magic")


@pytest.mark.parametrize("version", [2, 4])
def test_other_versions(valid: Path, version: int) -> None:
    set_version(valid, version)
    refused(valid, f"unsupported format version {version}")


@pytest.mark.parametrize("keep", [0, 10, 63, 64, 4096, -1])
def test_truncated(valid: Path, keep: int) -> None:
    size = valid.stat().st_size
    os.truncate(valid, size - 1 if keep == -1 else keep)
    refused(valid, "truncated")


def test_trailing_bytes(valid: Path) -> None:
    with open(valid, "ab") as f:
        f.write(b"\x00")
    refused(valid, "trailing bytes")


# A refused data_offset is refused for the check it fails: an aligned one (the 2125824 = 519 * 4096, or 0)
# was once reported as "not a multiple of 4096". Both readers, since `ninfer inspect` and the engine use different ones.
DATA_OFFSETS = {4097: "not a multiple of 4096", 2125824: "truncated", 0: "manifest"}


@pytest.mark.parametrize("data_offset", list(DATA_OFFSETS))
def test_a_refused_data_offset_names_the_check_it_fails(valid: Path, data_offset: int) -> None:
    patch(valid, 0, replace(read_header(valid), data_offset=data_offset).pack())
    problem = DATA_OFFSETS[data_offset]
    with pytest.raises(ArtifactError) as python_refusal:
        read_artifact(valid)
    for message in (refused(valid, problem), str(python_refusal.value)):
        assert problem in message and str(valid) in message, message
        assert (data_offset % 4096 != 0) == ("not a multiple" in message), message


def test_manifest_crc(valid: Path) -> None:
    patch(valid, 64 + 5, b"X")
    refused(valid, "manifest checksum mismatch")


def test_manifest_not_json(valid: Path) -> None:
    rewrite_manifest(valid, text=b'{"format": "ninfer", "version": 3,')
    refused(valid, "manifest is not valid JSON")


def _edit_blob(path: Path, tensor: str, blob: str, **fields) -> None:
    def edit(manifest: dict) -> None:
        tensor_entry(manifest, tensor)["blobs"][blob].update(fields)

    rewrite_manifest(path, edit)


def test_blob_out_of_bounds(valid: Path) -> None:
    _edit_blob(valid, "w", "q", offset=read_header(valid).data_size - 64)
    refused(valid, "tensor w blob q: out of bounds")


def test_blob_size_mismatch(valid: Path) -> None:
    _edit_blob(valid, "w", "scale", nbytes=16)
    refused(valid, "tensor w blob scale: size mismatch")


def test_blob_misaligned(valid: Path) -> None:
    _edit_blob(valid, "w", "q", offset=8)
    refused(valid, "not 64-byte aligned")


def test_blob_overlap(valid: Path) -> None:
    manifest = json.loads(valid.read_bytes()[64:64 + read_header(valid).manifest_size])
    _edit_blob(valid, "v", "data", offset=tensor_entry(manifest, "w")["blobs"]["q"]["offset"])
    refused(valid, "overlaps")


def test_missing_blob(valid: Path) -> None:
    def edit(manifest: dict) -> None:
        del tensor_entry(manifest, "w")["blobs"]["zero"]

    rewrite_manifest(valid, edit)
    refused(valid, "tensor w")


def test_unknown_encoding(valid: Path) -> None:
    def edit(manifest: dict) -> None:
        tensor_entry(manifest, "w")["encoding"] = "int3"

    rewrite_manifest(valid, edit)
    refused(valid, 'tensor w: unknown encoding "int3"')


def test_bad_group_size(valid: Path) -> None:
    def edit(manifest: dict) -> None:
        tensor_entry(manifest, "w")["group_size"] = 48

    rewrite_manifest(valid, edit)
    refused(valid, "group_size 48")


def test_malformed_entry(valid: Path) -> None:
    def edit(manifest: dict) -> None:
        tensor_entry(manifest, "w")["shape"] = "8x64"

    rewrite_manifest(valid, edit)
    refused(valid, "malformed manifest (tensor w)")


def test_checksum_mismatch(valid: Path) -> None:
    header = read_header(valid)
    manifest = json.loads(valid.read_bytes()[64:64 + header.manifest_size])
    offset = header.data_offset + tensor_entry(manifest, "v")["blobs"]["data"]["offset"] + 3
    patch(valid, offset, bytes([valid.read_bytes()[offset] ^ 0x10]))
    refused(valid, "checksum mismatch in tensor v blob data")
    # Opting out of verification opens it (the caller asked not to pay for the check).
    with _engine.Artifact.open(valid, verify_checksums=False) as art:
        assert art.tensor_names() == ["v", "w"]


def test_missing_tensor_and_wrong_shape(valid: Path) -> None:
    with _engine.Artifact.open(valid) as art:
        assert art.tensor_info("w", [8, 64])["shape"] == (8, 64)
        with pytest.raises(ArtifactError) as info:
            art.tensor_info("layers.0.mlp.up")
        assert str(valid) in str(info.value) and "missing tensor layers.0.mlp.up" in str(info.value)
        with pytest.raises(ArtifactError) as info:
            art.tensor_info("w", [64, 8])
        assert str(valid) in str(info.value) and "tensor w has shape [8, 64], expected [64, 8]" in str(info.value)


def test_unopenable_paths(tmp_path: Path) -> None:
    refused(tmp_path / "absent.ninfer", "cannot open")
    (tmp_path / "dir.ninfer").mkdir()
    refused(tmp_path / "dir.ninfer", "not a regular file")


# --- fuzzing --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_seed(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    rng = np.random.default_rng(3)
    path = write_artifact(tmp_path_factory.mktemp("fuzz") / "seed.ninfer", {
        "a": random_codes(rng, "int8", (2, 32), 32),
        "b": random_codes(rng, "nvfp4", (2, 16)),
        "c": random_codes(rng, "fp8_e4m3", (3, 5)),
    })
    return path.read_bytes()


def _open_fuzzed(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.ninfer"
    path.write_bytes(data)
    try:
        with _engine.Artifact.open(path) as art:
            for name in art.tensor_names():
                art.dequantize(name)  # whatever passed the checks must be readable without a crash
    except ArtifactError as e:
        assert str(path) in str(e)


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_fuzz_bytes(tmp_path: Path, fuzz_seed: bytes, edits: list[tuple[int, int]], cut: int | None) -> None:
    """Flipped and truncated bytes anywhere: the reader only ever raises ArtifactError (or opens a file whose
    damage no check covers, e.g. a flipped padding byte)."""
    data = bytearray(fuzz_seed)
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    _open_fuzzed(tmp_path, bytes(data))


@_FUZZ
@given(start=st.integers(0, 1 << 16), length=st.integers(0, 64), insert_at=st.integers(0, 1 << 16),
       replace=st.booleans())
def test_fuzz_manifest_splices(tmp_path: Path, fuzz_seed: bytes, start: int, length: int, insert_at: int,
                               replace: bool) -> None:
    """Spliced manifests with a valid CRC, so the JSON parser and the entry checks meet the damage."""
    header = Header.unpack(fuzz_seed[:64])
    manifest = fuzz_seed[64:64 + header.manifest_size]
    piece = manifest[start % len(manifest):][:length]
    at = insert_at % (len(manifest) + 1)
    spliced = manifest[:at] + piece + manifest[at + (len(piece) if replace else 0):]
    if 64 + len(spliced) > header.data_offset:
        spliced = spliced[:header.data_offset - 64]
    sealed = Header(header.magic, header.version, header.flags, header.manifest_offset, len(spliced),
                    header.data_offset, header.data_size, zlib.crc32(spliced)).pack()
    body = spliced + bytes(header.data_offset - 64 - len(spliced))
    _open_fuzzed(tmp_path, sealed + body + fuzz_seed[header.data_offset:])


def test_checksums_of_every_length(tmp_path: Path) -> None:
    """Blob sizes 1..300 bytes and a few large odd ones: every path of the CRC (vector bulk, 16-byte folds, byte
    tail) agrees with zlib's, which the Python writer recorded; a single flipped bit is then caught."""
    rng = np.random.default_rng(11)
    lengths = [*range(1, 301), 4095, 65537, 1 << 20]
    tensors = {f"t{n}": ("int8", 32, {"q": rng.integers(0, 256, (n, 32), dtype=np.uint8),
                                      "scale": rng.random((n, 1)).astype(np.float16),
                                      "zero": rng.integers(0, 256, (n, 1), dtype=np.uint8)}) for n in lengths[-3:]}
    tensors |= {f"b{n}": ("fp8_e4m3", None, {"q": rng.integers(0, 256, (1, n), dtype=np.uint8),
                                             "scale": np.ones(1, np.float32)}) for n in lengths}
    path = write_artifact(tmp_path / "lengths.ninfer", tensors)
    _engine.Artifact.open(path).close()
    manifest = json.loads(path.read_bytes()[64:64 + read_header(path).manifest_size])
    header = read_header(path)
    for name in ("b1", "b17", "b64", "b255", "t65537"):
        blob = tensor_entry(manifest, name)["blobs"]["q"]
        position = header.data_offset + blob["offset"] + blob["nbytes"] - 1
        original = path.read_bytes()[position]
        patch(path, position, bytes([original ^ 0x01]))
        refused(path, f"checksum mismatch in tensor {name} blob q")
        patch(path, position, bytes([original]))


def test_checksum_speed(tmp_path: Path) -> None:
    """Verification must keep up with big artifacts: at least 1 GB/s (a 15 GB file verifies in seconds)."""
    blob = np.random.default_rng(0).integers(0, 256, (64, 1 << 20), dtype=np.uint8)  # 64 MiB in 64 blobs
    path = write_artifact(tmp_path / "big.ninfer", {
        f"t{i}": ("int8", 32, {"q": blob[i].reshape(1024, 1024), "scale": np.ones((1024, 32), np.float16),
                               "zero": np.zeros((1024, 32), np.uint8)}) for i in range(64)})
    _engine.Artifact.open(path).close()  # page cache warm
    best = min(_timed_open(path) for _ in range(3))
    size = path.stat().st_size
    assert size / best > 1e9, f"{size / best / 1e9:.2f} GB/s"
    shutil.rmtree(tmp_path)


def _timed_open(path: Path) -> float:
    start = time.perf_counter()
    _engine.Artifact.open(path).close()
    return time.perf_counter() - start
