"""GGUF -> .ninfer on a real model (SmolLM2-135M-Instruct Q4_1): weights, config and tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, quants
from tokenizers import Tokenizer

from ninfer.artifact.convert import convert
from ninfer.artifact.encodings import decode, encode
from ninfer.artifact.reader import read_artifact


@pytest.fixture(scope="module")
def smollm2_artifact(smollm2_gguf, tmp_path_factory):
    return convert(smollm2_gguf, tmp_path_factory.mktemp("smollm2") / "smollm2.ninfer", recipe="bf16",
                   progress=False)


def test_weights_are_the_dequantized_gguf_in_bf16(smollm2_gguf, smollm2_artifact):
    reader = GGUFReader(smollm2_gguf)
    # GGUF tensor names -> logical names, spelled out here for the ones a llama GGUF holds.
    block = {"attn_norm": "input_norm", "ffn_norm": "post_attn_norm", "attn_q": "attn.q_proj",
             "attn_k": "attn.k_proj", "attn_v": "attn.v_proj", "attn_output": "attn.o_proj",
             "ffn_gate": "mlp.gate", "ffn_up": "mlp.up", "ffn_down": "mlp.down"}
    with read_artifact(smollm2_artifact, verify_checksums=True) as artifact:
        assert len(artifact.tensors) == len(reader.tensors) == 272
        for tensor in reader.tensors:
            if tensor.name.startswith("blk."):
                _, layer, kind, _ = tensor.name.split(".")
                name = f"layers.{layer}.{block[kind]}"
            else:
                name = {"token_embd.weight": "embed", "output_norm.weight": "final_norm"}[tensor.name]
            source = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            entry = artifact.tensor(name)
            encoding = entry["encoding"]
            assert encoding == ("f32" if source.ndim == 1 else "bf16"), name  # the bf16 recipe keeps 1-D in f32
            got = decode(artifact.tensor_bytes(name), encoding, entry["shape"], None)
            # The recipe's rounding of the dequantized values, nothing else (Q/K rows stay in GGUF's order).
            np.testing.assert_array_equal(got, decode(encode(source, encoding, None), encoding, source.shape, None),
                                          err_msg=name)


def test_config_from_gguf_metadata(smollm2_artifact):
    with read_artifact(smollm2_artifact) as artifact:
        config, frontend = artifact.config, artifact.frontend
    assert (config["arch"], config["num_layers"], config["hidden_size"], config["intermediate_size"]) == (
        "llama", 30, 576, 1536)
    assert (config["num_heads"], config["num_kv_heads"], config["head_dim"], config["vocab_size"]) == (9, 3, 64, 49152)
    assert config["rope"] == {"theta": 100000.0, "rotary_dim": 64, "pairing": "interleaved", "mrope_section": None}
    assert config["rms_norm_eps"] == pytest.approx(1e-5)
    assert config["tie_word_embeddings"] and config["max_position_embeddings"] == 8192
    assert (config["bos_token_id"], config["eos_token_ids"]) == (1, [2])
    assert frontend["special_tokens"] == {"bos": 1, "eos": [2], "pad": 2}
    assert frontend["chat_templates"]["default"].startswith("{% for message in messages %}")
    assert "<|im_start|>" in frontend["chat_templates"]["default"]


def test_gguf_tokenizer(smollm2_artifact):
    with read_artifact(smollm2_artifact) as artifact:
        tokenizer = Tokenizer.from_str(artifact.frontend["tokenizer_json"])
    assert tokenizer.get_vocab_size() == 49152
    ids = tokenizer.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n").ids
    assert ids[0] == 1 and ids[-2:] == [2, 198]  # control tokens are single ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n")
    # Digits are split one by one (the 'smollm' pre-tokenizer), as SmolLM's own tokenizer does.
    assert len(tokenizer.encode("2024").ids) == 4


@pytest.mark.slow
def test_gguf_tokenizer_matches_transformers_gguf_loader(smollm2_gguf, smollm2_artifact, jargon_text):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    with read_artifact(smollm2_artifact) as artifact:
        ours = Tokenizer.from_str(artifact.frontend["tokenizer_json"])
    # transformers' GGUF loader ignores `tokenizer.ggml.pre` (it never splits digits one by one, which SmolLM's
    # own tokenizer and llama.cpp's 'smollm' pre-tokenizer do), so compare on text without digits.
    paragraphs = [p for p in jargon_text.split("\n\n") if p.strip() and not any(c.isdigit() for c in p)][:3000]
    assert len(paragraphs) > 1000
    mismatches = [p for p in paragraphs if ours.encode(p).ids != reference.encode(p, add_special_tokens=False)]
    assert not mismatches, f"{len(mismatches)} of {len(paragraphs)} paragraphs differ, e.g. {mismatches[0][:200]!r}"
