"""A truncated or corrupt GGUF is a ConversionError naming the file, never a traceback (issue 18, item 2).

The fuzzed file is a real GGUF written by the `gguf` package's own GGUFWriter (a tiny llama: vocabulary, merges,
metadata, three tensors), so every structure a reader walks is there to be cut or corrupted. At every byte offset:
the file cut there, one bit flipped there, and an absurd count (2^62) written there. Whatever the damage,
`open_gguf_file` and the tensor loaders either succeed or raise ConversionError, whose message is one line. The
real default model's GGUF is checked for the issue's own cases (first 1,000 bytes, a 200 kB cut, counts of 2^62)
through the CLI: exit 2, one line on stderr.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from ninfer.artifact.gguf import open_gguf_file
from ninfer.cli.main import main
from ninfer.errors import ConversionError

ABSURD = struct.pack("<Q", 2**62)


def _tiny_gguf(path: Path) -> bytes:
    import gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_feed_forward_length(16)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_context_length(64)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab", "<s>", "</s>", "c"])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(4)
    writer.add_tensor("token_embd.weight", rng.standard_normal((6, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _opens_or_refuses(path: Path, data: bytes) -> str | None:
    """None if the damaged file opened (its tensors loaded); else the ConversionError's message."""
    path.write_bytes(data)
    try:
        source = open_gguf_file(path)
        for tensor in source.tensors:
            tensor.load()
    except ConversionError as exc:
        message = str(exc)
        assert "\n" not in message, message
        return message
    return None


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory) -> bytes:
    return _tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_the_fuzzed_file_is_a_valid_gguf(real_gguf, tmp_path):
    assert _opens_or_refuses(tmp_path / "x.gguf", real_gguf) is None


def test_every_truncation_is_a_conversion_error(real_gguf, tmp_path):
    refused = [_opens_or_refuses(tmp_path / "x.gguf", real_gguf[:cut]) for cut in range(len(real_gguf))]
    # Every cut loses bytes a reader needs (the last tensor's data ends the file), so every one is refused.
    assert all(message is not None for message in refused)
    assert all("x.gguf" in message for message in refused if message)


def test_every_bit_flip_is_opened_or_refused(real_gguf, tmp_path):
    refused = 0
    for offset in range(len(real_gguf)):
        damaged = bytearray(real_gguf)
        damaged[offset] ^= 1 << (offset % 8)
        refused += _opens_or_refuses(tmp_path / "x.gguf", bytes(damaged)) is not None
    assert refused > 0  # (flips inside tensor data or a string are a valid file; flips in the structure are not)


def test_an_absurd_count_at_every_offset_is_opened_or_refused(real_gguf, tmp_path):
    refused = 0
    for offset in range(0, len(real_gguf) - len(ABSURD) + 1):
        damaged = real_gguf[:offset] + ABSURD + real_gguf[offset + len(ABSURD):]
        refused += _opens_or_refuses(tmp_path / "x.gguf", damaged) is not None
    assert refused > 0


@pytest.mark.parametrize("case", ["first 1000 bytes", "200 kB", "tensor count 2^62", "key count 2^62"])
def test_the_default_models_damaged_gguf_is_one_line_and_exit_2(smollm2_gguf, tmp_path, capsys, case):
    data = smollm2_gguf.read_bytes()[: 200_000 if case == "200 kB" else 1_000_000]
    if case == "first 1000 bytes":
        data = data[:1000]
    elif case.startswith("tensor count"):
        data = data[:8] + ABSURD + data[16:]
    elif case.startswith("key count"):
        data = data[:16] + ABSURD + data[24:]
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(data)
    assert main(["convert", str(damaged), str(tmp_path / "out.ninfer"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "damaged.gguf" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out.ninfer").exists()
