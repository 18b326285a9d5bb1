"""Block-wise FP8 checkpoints (the official Qwen FP8 layout: `quantization_config = {"quant_method": "fp8", "fmt":
"e4m3", "weight_block_size": [128, 128]}`, each linear `weight` in float8_e4m3fn with a float32
`weight_scale_inv` of one entry per 128x128 block, the last blocks partial) convert, and the engine's logits match
HF transformers run on the checkpoint's dequantised weights (e4m3 x its block's scale).

No producer of this layout installs here (transformers' FP8 quantizer needs a GPU), so the test writes it as the
format documents, from a save_pretrained checkpoint, and checks the layout it wrote: dtypes, scale shapes, and that
dequantising reproduces the weights to e4m3's precision."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.errors import ConversionError
from safetensors.torch import load_file, save_file

BLOCK = 128
CONFIG = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 320, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "initializer_range": 0.05,
          "tie_word_embeddings": False}
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}
F32_TOL = 1e-4


def fp8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128x128 block: scale_inv = amax / 448, codes = weight / scale_inv in e4m3."""
    rows, cols = weight.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.zeros(br * BLOCK, bc * BLOCK)
    padded[:rows, :cols] = weight
    amax = padded.reshape(br, BLOCK, bc, BLOCK).abs().amax(dim=(1, 3))
    scale_inv = (amax / 448.0).clamp(min=1e-12)
    codes = (padded.reshape(br, BLOCK, bc, BLOCK) / scale_inv[:, None, :, None]).reshape(padded.shape)
    return codes[:rows, :cols].to(torch.float8_e4m3fn), scale_inv.to(torch.float32)


def dequantised(codes: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    rows, cols = codes.shape
    return codes.float() * scale_inv.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]


@pytest.fixture(scope="module")
def fp8_folder(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A save_pretrained llama rewritten into the FP8 layout; returns it and the dequantised weights."""
    import transformers

    folder = tmp_path_factory.mktemp("fp8")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    model.save_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    written, weights = {}, {}
    for name, value in state.items():
        if name.endswith("_proj.weight"):  # the linear layers; embeddings, head and norms stay as they are
            codes, scale_inv = fp8_blocks(value.float())
            written[name], written[name + "_scale_inv"] = codes, scale_inv
            weights[name] = dequantised(codes, scale_inv)
        else:
            written[name] = value
    save_file(written, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = FP8_CONFIG
    (folder / "config.json").write_text(json.dumps(config))
    return folder, weights


def test_the_written_layout_is_the_documented_one(fp8_folder):
    folder, weights = fp8_folder
    state = load_file(folder / "model.safetensors")
    down = state["model.layers.0.mlp.down_proj.weight"]
    assert down.dtype == torch.float8_e4m3fn and down.shape == (256, 320)
    assert state["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (2, 3)  # 320 = 2.5 blocks of 128
    original = transformers_weights(folder)["model.layers.0.mlp.down_proj.weight"]
    error = float((weights["model.layers.0.mlp.down_proj.weight"] - original).norm() / original.norm())
    assert 1e-3 < error < 5e-2  # e4m3's 3-bit mantissa: a few percent at most, never exact


def transformers_weights(folder: Path) -> dict[str, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).state_dict()


def test_fp8_checkpoint_matches_hf_on_its_dequantised_weights(fp8_folder, tmp_path):
    import transformers

    folder, weights = fp8_folder
    f32 = tmp_path / "f32.json"
    f32.write_text(json.dumps({"rules": [{"pattern": "*", "encoding": "f32"}]}))
    out = convert(folder, tmp_path / "m.ninfer", recipe=str(f32), progress=False)
    tokens = np.random.default_rng(3).integers(0, CONFIG["vocab_size"], 24).astype(np.int32)
    model = _testing.Model.open(str(out), kv_dtype="f32", threads=2, max_context=256)
    ours = model.prefill(model.new_sequence(), tokens, all_logits=True)

    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    state = transformers_weights(folder)
    state.update(weights)
    reference.load_state_dict(state)
    with torch.no_grad():
        theirs = reference(torch.tensor(tokens[None].astype(np.int64))).logits[0].numpy()
    assert np.abs(ours - theirs).max() <= F32_TOL * np.abs(theirs).max()


def test_a_scale_of_the_wrong_shape_is_refused(fp8_folder, tmp_path):
    folder, _ = fp8_folder
    state = load_file(folder / "model.safetensors")
    state["model.layers.0.mlp.down_proj.weight_scale_inv"] = torch.ones(2, 2)
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ConversionError, match=r"down_proj.weight_scale_inv has shape \[2, 2\].*need \[2, 3\]"):
        convert(bad, tmp_path / "out.ninfer", progress=False)


def test_other_pre_quantised_formats_are_refused_by_name(fp8_folder, tmp_path):
    folder, _ = fp8_folder
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    other = tmp_path / "bnb"
    other.mkdir()
    (other / "model.safetensors").symlink_to(folder / "model.safetensors")
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match='"quant_method": "bitsandbytes".*not supported'):
        convert(other, tmp_path / "out.ninfer", progress=False)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="no checkpoint tensor is stored in it"):
        convert(other, tmp_path / "out.ninfer", progress=False)
