"""HF safetensors folder -> .ninfer: every tensor decodes to the checkpoint's values, the config is normalised."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import QWEN35_VOCAB, fused_experts

from ninfer.artifact import hf
from ninfer.artifact.convert import convert
from ninfer.artifact.encodings import decode, encode
from ninfer.artifact.reader import read_artifact
from ninfer.frontend.templates import load_chat_template

# Checkpoint name -> logical name, written out here independently of the converter's own tables.
_EXPECTED = [
    (r"lm_head\.weight", "lm_head"),
    (r"(?:model\.language_model\.|model\.)embed_tokens\.weight", "embed"),
    (r"(?:model\.language_model\.|model\.)norm\.weight", "final_norm"),
    (r"model\.visual\.(.+)", r"visual.\1"),
    (r"mtp\.fc\.weight", "mtp.fc"),
    (r"mtp\.(pre_fc_norm_embedding|pre_fc_norm_hidden|norm)\.weight", r"mtp.\1"),
]
_LAYER_SUFFIX = {
    "input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_attn_norm",
    "self_attn.q_proj.weight": "attn.q_proj", "self_attn.k_proj.weight": "attn.k_proj",
    "self_attn.v_proj.weight": "attn.v_proj", "self_attn.o_proj.weight": "attn.o_proj",
    "self_attn.q_proj.bias": "attn.q_bias", "self_attn.k_proj.bias": "attn.k_bias",
    "self_attn.v_proj.bias": "attn.v_bias",
    "self_attn.q_norm.weight": "attn.q_norm", "self_attn.k_norm.weight": "attn.k_norm",
    "linear_attn.in_proj_qkv.weight": "gdn.in_qkv", "linear_attn.in_proj_z.weight": "gdn.in_z",
    "linear_attn.in_proj_b.weight": "gdn.in_b", "linear_attn.in_proj_a.weight": "gdn.in_a",
    "linear_attn.out_proj.weight": "gdn.out_proj", "linear_attn.conv1d.weight": "gdn.conv",
    "linear_attn.A_log": "gdn.A_log", "linear_attn.dt_bias": "gdn.dt_bias", "linear_attn.norm.weight": "gdn.norm",
    "mlp.gate_proj.weight": "mlp.gate", "mlp.up_proj.weight": "mlp.up", "mlp.down_proj.weight": "mlp.down",
    "mlp.gate.weight": "moe.router", "mlp.experts.down_proj": "moe.experts_down",
    "mlp.shared_expert.gate_proj.weight": "moe.shared_gate", "mlp.shared_expert.up_proj.weight": "moe.shared_up",
    "mlp.shared_expert.down_proj.weight": "moe.shared_down",
    "mlp.shared_expert_gate.weight": "moe.shared_expert_gate",
}


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder: the shards its index names, or its one model.safetensors."""
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else ["model.safetensors"]
    tensors = {}
    for file in files:
        tensors.update(load_file(str(folder / file)))
    return tensors


def expected_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Logical name -> float32 values, straight from the checkpoint files."""
    expected, experts = {}, {}
    for name, value in checkpoint_tensors(folder).items():
        array = value.to(torch.float32).numpy()
        layer = re.fullmatch(r"(?:model\.language_model\.|model\.|mtp\.)layers\.(\d+)\.(.+)", name)
        if layer:
            prefix = ("mtp." if name.startswith("mtp.") else "") + f"layers.{layer.group(1)}."
            suffix = layer.group(2)
            per_expert = re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", suffix)
            if per_expert:  # save_pretrained's layout: stacked in expert order below
                experts.setdefault(prefix + "moe.experts_" + per_expert.group(2), {})[int(per_expert.group(1))] = array
            elif suffix == "mlp.experts.gate_up_proj":
                half = array.shape[1] // 2
                expected[prefix + "moe.experts_gate"] = array[:, :half]
                expected[prefix + "moe.experts_up"] = array[:, half:]
            else:
                expected[prefix + _LAYER_SUFFIX[suffix]] = array.reshape(array.shape[0], -1) \
                    if suffix == "linear_attn.conv1d.weight" else array
            continue
        for pattern, logical in _EXPECTED:
            if re.fullmatch(pattern, name):
                expected[re.sub(pattern, logical, name)] = array
                break
        else:
            raise AssertionError(f"test mapping lacks {name}")
    for logical, by_expert in experts.items():
        expected[logical] = np.stack([by_expert[e] for e in range(len(by_expert))])
    return expected


def decoded(artifact, name: str) -> np.ndarray:
    entry = artifact.tensor(name)
    return decode(artifact.tensor_bytes(name), entry["encoding"], entry["shape"], entry.get("group_size"))


@pytest.fixture(params=["qwen3_5", "qwen3_5_moe", "llama", "qwen2", "qwen3"])
def tiny_checkpoint(request) -> tuple[str, Path]:
    return request.param, request.getfixturevalue(f"tiny_{request.param}")


def test_bf16_artifact_holds_exactly_the_checkpoint_weights(tiny_checkpoint, tmp_path):
    kind, folder = tiny_checkpoint
    out = convert(folder, tmp_path / f"{kind}.ninfer", recipe="bf16", progress=False)
    expected = expected_tensors(folder)
    with read_artifact(out, verify_checksums=True) as artifact:
        assert sorted(t["name"] for t in artifact.tensors) == sorted(expected)
        for name, values in expected.items():
            got = decoded(artifact, name)
            assert got.shape == values.shape, name
            np.testing.assert_array_equal(got, values, err_msg=name)
        assert artifact.config["arch"] == kind
        assert artifact.source["kind"] == "hf"


def test_fused_experts_give_the_per_expert_artifact(tiny_qwen3_5_moe, tmp_path):
    """Routed experts fused (`mlp.experts.gate_up_proj` / `down_proj`, transformers' in-memory layout, which a
    checkpoint saved from a state dict holds) convert to what the same weights one tensor per expert convert to. The
    fused copy is written by hand, in one model.safetensors, because save_pretrained always splits the experts."""
    fused = tmp_path / "fused"
    fused.mkdir()
    for file in ("config.json", "generation_config.json", "preprocessor_config.json"):
        shutil.copy(tiny_qwen3_5_moe / file, fused / file)
    save_file(fused_experts(checkpoint_tensors(tiny_qwen3_5_moe)), str(fused / "model.safetensors"),
              metadata={"format": "pt"})
    expected = expected_tensors(fused)
    assert "layers.0.moe.experts_gate" in expected and "mtp.layers.0.moe.experts_down" in expected
    per_expert = convert(tiny_qwen3_5_moe, tmp_path / "per-expert.ninfer", recipe="bf16", progress=False)
    stacked = convert(fused, tmp_path / "fused.ninfer", recipe="bf16", progress=False)
    with read_artifact(per_expert) as theirs, read_artifact(stacked) as ours:
        assert sorted(t["name"] for t in ours.tensors) == sorted(t["name"] for t in theirs.tensors) == sorted(expected)
        for name, values in expected.items():
            np.testing.assert_array_equal(decoded(ours, name), values, err_msg=name)
            np.testing.assert_array_equal(decoded(theirs, name), values, err_msg=name)


def test_quantized_artifact_holds_each_tensor_in_its_recipe_encoding(tiny_qwen3_5_moe, tmp_path):
    out = convert(tiny_qwen3_5_moe, tmp_path / "moe-int4.ninfer", recipe="groupwise-int", progress=False)
    expected = expected_tensors(tiny_qwen3_5_moe)
    with read_artifact(out) as artifact:
        encodings = {t["name"]: t["encoding"] for t in artifact.tensors}
        assert encodings["layers.0.moe.experts_gate"] == "int4"
        assert encodings["layers.0.moe.router"] == "bf16"
        for name, values in expected.items():
            entry = artifact.tensor(name)
            # The artifact must hold what the encoding makes of exactly these source values.
            reference = decode(encode(values, entry["encoding"], entry.get("group_size")), entry["encoding"],
                               values.shape, entry.get("group_size"))
            np.testing.assert_array_equal(decoded(artifact, name), reference, err_msg=name)


def test_qwen35_config_and_frontend(tiny_qwen3_5, tmp_path):
    out = convert(tiny_qwen3_5, tmp_path / "q.ninfer", progress=False)
    source = json.loads((tiny_qwen3_5 / "config.json").read_text())["text_config"]
    with read_artifact(out) as artifact:
        config, frontend = artifact.config, artifact.frontend
    assert config["layer_types"] == source["layer_types"]
    assert config["layer_types"].count("full_attention") == 2
    assert (config["num_layers"], config["vocab_size"], config["head_dim"]) == (8, QWEN35_VOCAB, 32)
    assert config["linear_attention"] == {"num_key_heads": 2, "num_value_heads": 4, "key_head_dim": 16,
                                          "value_head_dim": 24, "conv_kernel": 4}
    assert config["rope"] == {"theta": 1e7, "rotary_dim": 8, "pairing": "half", "mrope_section": [2, 1, 1]}
    assert config["norm_offset"] and config["attn_output_gate"] and config["qk_norm"]
    assert not config["qkv_bias"] and not config["tie_word_embeddings"]
    assert config["mtp"] == {"num_layers": 1} and config["moe"] is None and config["intermediate_size"] == 128
    assert config["eos_token_ids"] == [248046, 248044] and config["bos_token_id"] is None
    assert frontend["special_tokens"] == {"bos": None, "eos": [248046, 248044], "pad": 248044}
    assert frontend["chat_templates"] == {"default": load_chat_template("qwen3_5")}
    assert frontend["generation_defaults"] == {"temperature": 1.0, "top_p": 0.95, "top_k": 20}  # do_sample: not carried
    assert frontend["preprocessing"]["image"]["patch_size"] == 4
    from tokenizers import Tokenizer

    assert Tokenizer.from_str(frontend["tokenizer_json"]).encode("Hello <|im_start|>user").ids == [9419, 220,
                                                                                                    248045, 846]


def test_moe_config_and_template_option(tiny_qwen3_5_moe, tmp_path):
    out = convert(tiny_qwen3_5_moe, tmp_path / "m.ninfer", template="qwen3_8", progress=False)
    with read_artifact(out) as artifact:
        assert artifact.config["moe"] == {"num_experts": 8, "top_k": 2, "intermediate_size": 32,
                                          "shared_intermediate_size": 48}
        assert artifact.config["intermediate_size"] is None
        assert artifact.frontend["chat_templates"]["default"] == load_chat_template("qwen3_8")
        assert artifact.tensor("layers.3.moe.experts_up")["shape"] == [8, 32, 64]
        assert artifact.tensor("mtp.layers.0.moe.experts_down")["shape"] == [8, 64, 32]


def test_plain_decoder_configs(tiny_llama, tiny_qwen2, tiny_qwen3, tmp_path):
    configs = {}
    for kind, folder in (("llama", tiny_llama), ("qwen2", tiny_qwen2), ("qwen3", tiny_qwen3)):
        with read_artifact(convert(folder, tmp_path / f"{kind}.ninfer", progress=False)) as artifact:
            configs[kind] = artifact.config
            assert artifact.frontend["chat_templates"] == {"default": load_chat_template("chatml")}
    assert configs["llama"]["rope"] == {"theta": 10000.0, "rotary_dim": 16, "pairing": "half", "mrope_section": None}
    assert not configs["llama"]["norm_offset"] and configs["llama"]["linear_attention"] is None
    assert configs["qwen2"]["qkv_bias"] and configs["qwen2"]["tie_word_embeddings"]
    assert configs["qwen3"]["qk_norm"] and configs["qwen3"]["head_dim"] == 32
    assert configs["qwen3"]["eos_token_ids"] == [2] and configs["qwen3"]["bos_token_id"] == 1


def test_failing_source_leaves_no_file(tiny_qwen3, tmp_path, monkeypatch):
    original = hf._SafetensorsIndex.loader
    calls = {"n": 0}

    def failing_loader(self, name, *args, **kwargs):
        load = original(self, name, *args, **kwargs)

        def wrapped():
            calls["n"] += 1
            if calls["n"] == 5:
                raise OSError("simulated read error")
            return load()

        return wrapped

    monkeypatch.setattr(hf._SafetensorsIndex, "loader", failing_loader)
    out = tmp_path / "broken.ninfer"
    with pytest.raises(OSError, match="simulated read error"):
        convert(tiny_qwen3, out, progress=False)
    assert calls["n"] == 5
    assert list(tmp_path.iterdir()) == []
