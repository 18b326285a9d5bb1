"""The `.ninfer` v3 writer and reader: round trips of every encoding, layout invariants, atomic commits, the
reader's refusals (each naming the file and the problem), and `ninfer inspect`."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from ninfer.artifact import encodings as enc
from ninfer.artifact.format import HEADER_SIZE, MAGIC, Header, crc32, manifest_bytes
from ninfer.artifact.reader import read_artifact
from ninfer.artifact.writer import ArtifactWriter, TensorPlan
from ninfer.cli.main import main
from ninfer.errors import ArtifactError

SEED = int.from_bytes(os.urandom(4), "little")
CONFIG = {"arch": "qwen3_5", "vocab_size": 64, "hidden_size": 128, "num_layers": 1}
FRONTEND = {
    "tokenizer_json": '{"model": "' + "x" * 5000 + '"}',
    "chat_templates": {"default": "{{ x }}"},
    "generation_defaults": {"temperature": 0.6},
    "preprocessing": {},
    "special_tokens": {"bos": None, "eos": [1], "pad": 1},
}
RECIPE = {"name": "test", "rules": []}
SOURCE = {"kind": "synthetic", "path": "-", "architecture": "test"}

PLANS = [
    TensorPlan("embed", (64, 128), "bf16"),
    TensorPlan("final_norm", (128,), "f32"),
    TensorPlan("layers.0.attn.q_proj", (33, 128), "fp8_e4m3"),
    TensorPlan("layers.0.mlp.up", (17, 256), "int8", 64),
    TensorPlan("layers.0.mlp.down", (9, 96), "int4", 32),
    TensorPlan("layers.0.moe.experts_gate", (3, 7, 128), "int4", 128),
    TensorPlan("layers.0.moe.experts_up", (3, 5, 64), "nvfp4"),
    TensorPlan("layers.0.attn.o_proj", (5, 48), "f16"),
]


def random_values(shape: tuple[int, ...], salt: int) -> np.ndarray:
    return np.random.default_rng(SEED + salt).standard_normal(shape).astype(np.float32)


def write_artifact(path: Path, plans: list[TensorPlan] = PLANS, order_seed: int = 0) -> dict[str, np.ndarray]:
    values = {plan.name: random_values(plan.shape, i) for i, plan in enumerate(plans)}
    order = list(values)
    random.Random(order_seed).shuffle(order)  # tensors may arrive in any order
    with ArtifactWriter(
        path, config=CONFIG, tensors=plans, frontend=FRONTEND, recipe=RECIPE, source=SOURCE, progress=False
    ) as writer:
        for name in order:
            writer.write(name, values[name])
    return values


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "model.ninfer"
    write_artifact(path)
    return path


def test_round_trip_of_every_encoding(tmp_path: Path):
    path = tmp_path / "model.ninfer"
    values = write_artifact(path, order_seed=SEED)
    info = read_artifact(path, verify_checksums=True)
    assert (info.version, info.config, info.frontend, info.recipe, info.source) == (
        3,
        CONFIG,
        FRONTEND,
        RECIPE,
        SOURCE,
    )
    assert [t["name"] for t in info.tensors] == [p.name for p in PLANS]
    for plan in PLANS:
        stored = info.tensor_bytes(plan.name)
        expected = enc.encode(values[plan.name], plan.encoding, plan.group_size)
        assert stored.keys() == expected.keys()
        for blob_name in expected:
            np.testing.assert_array_equal(stored[blob_name], expected[blob_name])
        decoded = enc.decode(stored, plan.encoding, plan.shape, plan.group_size)
        assert decoded.shape == plan.shape
    assert info.tensor("layers.0.mlp.down")["group_size"] == 32
    assert "group_size" not in info.tensor("embed")


def test_layout_invariants(artifact: Path):
    raw = artifact.read_bytes()
    header = Header.unpack(raw)
    assert header.magic == MAGIC and header.version == 3 and header.manifest_offset == HEADER_SIZE
    assert header.data_offset % 4096 == 0 and len(raw) == header.data_offset + header.data_size
    assert raw[HEADER_SIZE + header.manifest_size : header.data_offset] == bytes(
        header.data_offset - HEADER_SIZE - header.manifest_size
    )
    manifest = json.loads(raw[HEADER_SIZE : HEADER_SIZE + header.manifest_size])
    assert crc32(raw[HEADER_SIZE : HEADER_SIZE + header.manifest_size]) == header.manifest_crc32
    for tensor in manifest["tensors"]:
        for blob in tensor["blobs"].values():
            assert blob["offset"] % 64 == 0 and len(blob["crc32"]) == 8
            start = header.data_offset + blob["offset"]
            assert f"{crc32(raw[start : start + blob['nbytes']]):08x}" == blob["crc32"]


def test_write_encoded_round_trip(tmp_path: Path):
    path = tmp_path / "synthetic.ninfer"
    plans = [TensorPlan("w", (4, 64), "int4", 32), TensorPlan("n", (64,), "bf16")]
    blobs = enc.encode(random_values((4, 64), 1), "int4", 32)
    norm = enc.f32_to_bf16_bits(random_values((64,), 2))
    with ArtifactWriter(
        path, config=CONFIG, tensors=plans, frontend={}, recipe=RECIPE, source=SOURCE, progress=False
    ) as writer:
        writer.write_encoded("w", blobs)
        writer.write_encoded("n", {"data": norm.tobytes()})
    info = read_artifact(path, verify_checksums=True)
    np.testing.assert_array_equal(info.tensor_bytes("w")["q"], blobs["q"])
    np.testing.assert_array_equal(info.tensor_bytes("n")["data"], norm)


def test_writer_refuses_mismatched_input(tmp_path: Path):
    plans = [TensorPlan("w", (4, 64), "int4", 32)]
    with ArtifactWriter(
        tmp_path / "a.ninfer", config={}, tensors=plans, frontend={}, recipe={}, source={}, progress=False
    ) as writer:
        with pytest.raises(ArtifactError, match="shape"):
            writer.write("w", np.zeros((4, 32), np.float32))
        with pytest.raises(ArtifactError, match="not in the plan"):
            writer.write("v", np.zeros((4, 64), np.float32))
        with pytest.raises(ArtifactError, match="expected uint8"):
            writer.write_encoded(
                "w",
                {
                    "q": np.zeros((4, 32), np.int8),
                    "scale": np.zeros((4, 2), np.float16),
                    "zero": np.zeros((4, 2), np.uint8),
                },
            )
        writer.write("w", np.zeros((4, 64), np.float32))
        with pytest.raises(ArtifactError, match="written twice"):
            writer.write("w", np.zeros((4, 64), np.float32))
    with pytest.raises(ArtifactError, match="cannot be written"):
        ArtifactWriter(
            tmp_path / "b.ninfer",
            config={},
            tensors=[TensorPlan("w", (4, 40), "nvfp4")],
            frontend={},
            recipe={},
            source={},
            progress=False,
        )


def test_an_exception_mid_write_leaves_no_file(tmp_path: Path):
    path = tmp_path / "model.ninfer"
    with (
        pytest.raises(RuntimeError, match="boom"),
        ArtifactWriter(
            path,
            config=CONFIG,
            tensors=PLANS,
            frontend=FRONTEND,
            recipe=RECIPE,
            source=SOURCE,
            progress=False,
        ) as writer,
    ):
        writer.write("embed", random_values((64, 128), 0))
        assert Path(f"{path}.partial").exists() and not path.exists()
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_commit_refuses_a_missing_tensor_and_cleans_up(tmp_path: Path):
    path = tmp_path / "model.ninfer"
    with (
        pytest.raises(ArtifactError, match="never written: layers.0"),
        ArtifactWriter(
            path,
            config=CONFIG,
            tensors=PLANS[:3],
            frontend=FRONTEND,
            recipe=RECIPE,
            source=SOURCE,
            progress=False,
        ) as writer,
    ):
        writer.write("embed", random_values((64, 128), 0))
        writer.write("final_norm", random_values((128,), 0))
    assert list(tmp_path.iterdir()) == []


def test_a_commit_replaces_an_existing_file_only_when_complete(tmp_path: Path):
    path = tmp_path / "model.ninfer"
    path.write_bytes(b"old")
    with (
        pytest.raises(RuntimeError),
        ArtifactWriter(
            path,
            config=CONFIG,
            tensors=PLANS,
            frontend=FRONTEND,
            recipe=RECIPE,
            source=SOURCE,
            progress=False,
        ),
    ):
        raise RuntimeError
    assert path.read_bytes() == b"old"
    write_artifact(path)
    read_artifact(path, verify_checksums=True)


# --- refusals ----------------------------------------------------------------------------------------------


def patch_header(path: Path, **fields) -> None:
    raw = bytearray(path.read_bytes())
    header = Header.unpack(bytes(raw))
    raw[:HEADER_SIZE] = dataclasses.replace(header, **fields).pack()
    path.write_bytes(bytes(raw))


def rewrite_manifest(path: Path, mutate) -> None:
    """Applies `mutate` to the parsed manifest and stores it back with a correct size and CRC."""
    raw = bytearray(path.read_bytes())
    header = Header.unpack(bytes(raw))
    manifest = json.loads(raw[HEADER_SIZE : HEADER_SIZE + header.manifest_size])
    mutate(manifest)
    body = manifest_bytes(manifest)
    assert HEADER_SIZE + len(body) <= header.data_offset
    raw[HEADER_SIZE : header.data_offset] = body + bytes(header.data_offset - HEADER_SIZE - len(body))
    raw[:HEADER_SIZE] = dataclasses.replace(
        header, manifest_size=len(body), manifest_crc32=crc32(body)
    ).pack()
    path.write_bytes(bytes(raw))


def blob(manifest: dict, tensor: str, name: str) -> dict:
    return next(t for t in manifest["tensors"] if t["name"] == tensor)["blobs"][name]


def flip_data_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    header = Header.unpack(bytes(raw))
    manifest = json.loads(raw[HEADER_SIZE : HEADER_SIZE + header.manifest_size])
    raw[header.data_offset + blob(manifest, "layers.0.mlp.up", "q")["offset"] + 5] ^= 0x10
    path.write_bytes(bytes(raw))


def set_field(tensor: str, key: str, value):
    def mutate(manifest: dict) -> None:
        next(t for t in manifest["tensors"] if t["name"] == tensor)[key] = value

    return mutate


def set_blob(tensor: str, name: str, key: str, value):
    def mutate(manifest: dict) -> None:
        blob(manifest, tensor, name)[key] = value

    return mutate


CORRUPTIONS = {
    "wrong magic": (lambda p: patch_header(p, magic=b"GGUF\0\0\0\0"), "wrong magic"),
    "version 2": (lambda p: patch_header(p, version=2),
                  "format version 2, this reader reads version 3 only: convert the model again"),
    "version 4": (lambda p: patch_header(p, version=4), "format version 4"),
    "truncated data": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
    "truncated header": (lambda p: p.write_bytes(p.read_bytes()[:40]), "truncated"),
    "empty file": (lambda p: p.write_bytes(b""), "truncated"),
    "trailing bytes": (lambda p: p.write_bytes(p.read_bytes() + b"x"), "unexpected bytes"),
    "manifest crc": (
        lambda p: patch_header(p, manifest_crc32=Header.unpack(p.read_bytes()).manifest_crc32 ^ 1),
        "manifest CRC mismatch",
    ),
    "not json": (lambda p: rewrite_manifest_raw(p, b"{not json"), "not valid JSON"),
    "unknown encoding": (
        lambda p: rewrite_manifest(p, set_field("embed", "encoding", "int3")),
        "tensor 'embed': unknown encoding 'int3'",
    ),
    "blob size": (
        lambda p: rewrite_manifest(p, set_blob("layers.0.mlp.up", "scale", "nbytes", 12)),
        "blob 'scale': size 12 bytes does not match shape [17, 256] as int8",
    ),
    "shape vs blob": (
        lambda p: rewrite_manifest(p, set_field("embed", "shape", [64, 64])),
        "blob 'data': size 16384 bytes does not match shape [64, 64]",
    ),
    "blob outside data": (
        lambda p: rewrite_manifest(p, set_blob("embed", "data", "offset", 1 << 20)),
        "lie outside the",
    ),
    "overlap": (lambda p: rewrite_manifest(p, set_blob("final_norm", "data", "offset", 0)), "overlap"),
    "unaligned blob": (
        lambda p: rewrite_manifest(p, set_blob("final_norm", "data", "offset", 16400)),
        "not a multiple of 64",
    ),
    "missing blob": (
        lambda p: rewrite_manifest(p, lambda m: m["tensors"][3]["blobs"].pop("zero")),
        "needs blobs",
    ),
    "bad group": (
        lambda p: rewrite_manifest(p, set_field("layers.0.mlp.up", "group_size", 48)),
        "group_size 32, 64 or 128",
    ),
    "duplicate name": (
        lambda p: rewrite_manifest(p, set_field("final_norm", "name", "embed")),
        "appears twice",
    ),
    "bad crc text": (
        lambda p: rewrite_manifest(p, set_blob("embed", "data", "crc32", "ABCDEF01")),
        "lowercase hex",
    ),
    "missing section": (lambda p: rewrite_manifest(p, lambda m: m.pop("config")), "'config'"),
}


def rewrite_manifest_raw(path: Path, body: bytes) -> None:
    raw = bytearray(path.read_bytes())
    header = Header.unpack(bytes(raw))
    raw[HEADER_SIZE : HEADER_SIZE + len(body)] = body
    raw[:HEADER_SIZE] = dataclasses.replace(
        header, manifest_size=len(body), manifest_crc32=crc32(body)
    ).pack()
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_reader_refusals_name_the_file_and_the_problem(artifact: Path, case: str):
    corrupt, problem = CORRUPTIONS[case]
    corrupt(artifact)
    with pytest.raises(ArtifactError) as refusal:
        read_artifact(artifact)
    assert str(artifact) in str(refusal.value)
    assert problem in str(refusal.value)


def test_checksum_mismatch_is_found_when_verifying(artifact: Path):
    flip_data_byte(artifact)
    read_artifact(artifact)  # structure is intact: opening without verification succeeds
    with pytest.raises(ArtifactError) as refusal:
        read_artifact(artifact, verify_checksums=True)
    assert str(artifact) in str(refusal.value)
    assert "checksum mismatch in tensor 'layers.0.mlp.up' blob 'q'" in str(refusal.value)


def test_missing_or_misshaped_tensor(artifact: Path):
    info = read_artifact(artifact)
    with pytest.raises(ArtifactError, match=f"{artifact}: tensor 'lm_head' is missing"):
        info.tensor("lm_head")
    with pytest.raises(ArtifactError, match=r"has shape \[64, 128\], expected \[64, 256\]"):
        info.tensor("embed", (64, 256))
    assert info.tensor("embed", (64, 128))["encoding"] == "bf16"


def test_unreadable_path():
    with pytest.raises(ArtifactError, match="/no/such/file.ninfer: cannot read"):
        read_artifact("/no/such/file.ninfer")


# --- ninfer inspect ----------------------------------------------------------------------------------------


def test_inspect_table(artifact: Path, capsys):
    assert main(["inspect", str(artifact)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("layers.0.mlp.down"))
    assert row.split()[:4] == ["layers.0.mlp.down", "int4", "9x96", "32"]
    assert "layers.0.moe.experts_gate" in out and "3x7x128" in out
    assert "arch=qwen3_5" in out and "recipe:   test" in out and "chat templates: default" in out


def test_inspect_json_hides_the_tokenizer_unless_full(artifact: Path, capsys):
    assert main(["inspect", "--json", str(artifact)]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["frontend"]["tokenizer_json"].startswith(f"<{len(FRONTEND['tokenizer_json'])} characters")
    assert manifest["tensors"][0]["name"] == "embed"
    assert main(["inspect", "--json", "--full", str(artifact)]) == 0
    assert json.loads(capsys.readouterr().out)["frontend"] == FRONTEND


def test_inspect_error_is_one_line_with_status_2(artifact: Path, capsys):
    patch_header(artifact, version=4)
    assert main(["inspect", str(artifact)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(artifact) in err and "version 4" in err
    flip_data_byte(artifact)
    patch_header(artifact, version=3)
    assert main(["inspect", "--verify", str(artifact)]) == 2
    assert "checksum mismatch" in capsys.readouterr().err


def test_header_struct_is_little_endian(artifact: Path):
    raw = artifact.read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 3 and struct.unpack_from("<Q", raw, 16)[0] == 64
