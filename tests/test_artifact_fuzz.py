"""Property-based fuzzing of the reader: whatever is done to a valid artifact's bytes or manifest, opening it
(with checksum verification) either succeeds or raises ArtifactError, never anything else."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ninfer.artifact.format import HEADER_SIZE, Header, crc32, manifest_bytes
from ninfer.artifact.reader import read_artifact
from ninfer.artifact.writer import ArtifactWriter, TensorPlan
from ninfer.errors import ArtifactError

PLANS = [
    TensorPlan("embed", (8, 32), "bf16"),
    TensorPlan("norm", (32,), "f32"),
    TensorPlan("fp8", (3, 32), "fp8_e4m3"),
    TensorPlan("int8", (2, 64), "int8", 32),
    TensorPlan("int4", (2, 3, 32), "int4", 32),
    TensorPlan("nvfp4", (3, 32), "nvfp4"),
]
WORKDIR = Path(tempfile.mkdtemp(prefix="ninfer-fuzz-"))
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def valid_artifact() -> bytes:
    path = WORKDIR / "valid.ninfer"
    rng = np.random.default_rng(0)
    with ArtifactWriter(
        path,
        config={"arch": "llama"},
        tensors=PLANS,
        frontend={"tokenizer_json": "{}"},
        recipe={"name": "fuzz", "rules": []},
        source={"kind": "synthetic"},
        progress=False,
    ) as writer:
        for plan in PLANS:
            writer.write(plan.name, rng.standard_normal(plan.shape).astype(np.float32))
    return path.read_bytes()


def opens_or_refuses(data: bytes) -> None:
    path = WORKDIR / "case.ninfer"
    path.write_bytes(data)
    try:
        info = read_artifact(path, verify_checksums=True)
    except ArtifactError as refusal:
        assert str(path) in str(refusal)
        return
    for entry in info.tensors:  # whatever opened must also be mappable
        info.tensor_bytes(entry["name"])
    info.close()


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=8))
def test_flipped_bytes(flips):
    data = bytearray(valid_artifact())
    for position, mask in flips:
        data[position % len(data)] ^= mask
    opens_or_refuses(bytes(data))


@FUZZ
@given(st.integers(0, 1 << 20))
def test_truncated(length):
    data = valid_artifact()
    opens_or_refuses(data[: length % len(data)])


@FUZZ
@given(st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.integers(1, 4096))
def test_spliced(source, target, length):
    data = bytearray(valid_artifact())
    source, target = source % len(data), target % len(data)
    piece = data[source : source + length]
    data[target : target + len(piece)] = piece
    opens_or_refuses(bytes(data))


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 1 << 20))
def test_inserted_bytes(junk, position):
    data = valid_artifact()
    position %= len(data)
    opens_or_refuses(data[:position] + junk + data[position:])


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["int4", "nvfp4", "bf16", "q", "scale", "00000000", 32, 64, 0, -1, 4096, 1 << 64]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


def paths_in(value, prefix=()):
    """Every key path into a parsed JSON document."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths_in(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths_in(child, (*prefix, index))


@FUZZ
@given(st.data())
def test_mutated_manifest_fields(data):
    raw = valid_artifact()
    header = Header.unpack(raw)
    manifest = json.loads(raw[HEADER_SIZE : HEADER_SIZE + header.manifest_size])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in paths_in(manifest) if p and not (p[0] == "frontend" and len(p) > 2)]
        path = data.draw(st.sampled_from(paths))
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(JSON_VALUES)
    try:
        body = manifest_bytes(manifest)
    except ValueError:  # infinities drawn for a float field cannot be written as JSON
        return
    # A correct CRC and size, so the mutation reaches the manifest validation instead of the CRC check.
    room = header.data_offset - HEADER_SIZE
    if len(body) > room:
        return
    new_header = dataclasses.replace(header, manifest_size=len(body), manifest_crc32=crc32(body))
    opens_or_refuses(new_header.pack() + body + bytes(room - len(body)) + raw[header.data_offset :])


def test_the_unmutated_artifact_opens():
    opens_or_refuses(valid_artifact())
    assert read_artifact(WORKDIR / "case.ninfer", verify_checksums=True).config == {"arch": "llama"}
