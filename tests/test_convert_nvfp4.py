"""NVFP4 checkpoints convert into the artifact's nvfp4 encoding without re-quantising, and the engine's logits match
HF transformers run on the checkpoint's dequantised weights.

- compressed-tensors `nvfp4-pack-quantized` comes from the producer itself (compressed-tensors' NVFP4 presets applied
  to a save_pretrained llama, its own global and block scales, its ModelCompressor packing), weight-only (NVFP4A16)
  and W4A4 (NVFP4, whose activation scales the engine does not use). Its global scale divides, the artifact's
  multiplies: the codes and block scales are kept byte for byte, the global scale is the reciprocal, and the converter
  prints the f32 rounding that adds.
- ModelOpt's NVFP4 export does not install here (nvidia-modelopt pulls a CUDA stack), so its layout is written from
  its documentation (hf_nvfp4.py names what was read) by a packer here, checked against an unpack written separately,
  and converted exactly."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp, generate_gparam
from ninfer.artifact.convert import convert
from ninfer.artifact.encodings import decode, encode
from ninfer.artifact.hf_nvfp4 import stack_nvfp4
from ninfer.artifact.reader import read_artifact
from ninfer.errors import ConversionError
from quantized_llama import CONFIG, assert_logits_match, convert_layers_as
from safetensors.torch import load_file, save_file

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # magnitudes of codes 0..7; bit 3 is the sign


def new_llama():
    """The tiny llama, seeded, in bf16."""
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(torch.bfloat16)


def write_compressed(folder: Path, preset: str) -> None:
    """A save_pretrained llama quantised with compressed-tensors' `preset` and packed by its compressor, lm_head
    unquantised."""
    model = new_llama()
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(
        preset, ["Linear"])}, ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_global_scale"):
            weight = module.weight
            global_scale = generate_gparam(weight.amin(), weight.amax())
            module.weight_global_scale.data.copy_(global_scale)
            scale, _ = compute_dynamic_scales_and_zp(weight, module.quantization_scheme.weights, module,
                                                     global_scale=global_scale)
            module.weight_scale.data.copy_(scale)
            if hasattr(module, "input_global_scale"):  # W4A4: a calibrated activation scale
                module.input_global_scale.data.fill_(1.0)
    compressor = ModelCompressor.from_pretrained_model(model, "nvfp4-pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)


@pytest.fixture(scope="module", params=["NVFP4A16", "NVFP4"])
def compressed(request, tmp_path_factory) -> tuple[Path, Path, list[str]]:
    root = tmp_path_factory.mktemp(request.param)
    write_compressed(root / "ckpt", request.param)
    logging.getLogger("ninfer.artifact.convert").setLevel(logging.INFO)
    handler = _Collect()
    logging.getLogger("ninfer.artifact").addHandler(handler)
    try:
        out = convert_layers_as("nvfp4", root / "ckpt", root / "m.ninfer")
    finally:
        logging.getLogger("ninfer.artifact").removeHandler(handler)
    return root / "ckpt", out, handler.messages


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_producer_wrote_nvfp4_pack_quantized(compressed):
    folder, _, _ = compressed
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "nvfp4-pack-quantized"
    state = load_file(folder / "model.safetensors")
    assert state["model.layers.0.mlp.down_proj.weight_packed"].dtype == torch.uint8
    assert state["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.float8_e4m3fn


def test_codes_and_block_scales_are_the_producers_and_the_global_scale_its_reciprocal(compressed):
    folder, out, messages = compressed
    state = load_file(folder / "model.safetensors")
    with read_artifact(out) as artifact:
        for layer in range(CONFIG["num_hidden_layers"]):
            prefix = f"model.layers.{layer}.mlp.down_proj"
            entry = artifact.tensor(f"layers.{layer}.mlp.down")
            blobs = artifact.tensor_bytes(entry["name"])
            assert entry["encoding"] == "nvfp4"
            np.testing.assert_array_equal(blobs["q"], state[prefix + ".weight_packed"].numpy())
            np.testing.assert_array_equal(blobs["scale"], state[prefix + ".weight_scale"].view(torch.uint8).numpy())
            global_scale = state[prefix + ".weight_global_scale"].item()
            assert blobs["global_scale"].view(np.float32)[0] == np.float32(1 / np.float32(global_scale))
    # The reciprocal's rounding is measured and printed: an f32 ulp or so.
    reports = [m for m in messages if m.startswith("layers.0.mlp.down: rearranged as nvfp4, relative error")]
    assert len(reports) == 1 and float(reports[0].rsplit(" ", 1)[1]) < 1e-6


def test_logits_match_hf_on_the_producers_dequantised_weights(compressed):
    folder, out, _ = compressed
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 16
    state = load_file(folder / "model.safetensors")
    weights = {name: value.float() for name, value in state.items() if "weight_" not in name
               and not name.endswith("input_global_scale")}
    for name in [n for n in state if n.endswith(".weight_packed")]:
        module = name[: -len(".weight_packed")]
        local = {key[len(module) + 1:]: value for key, value in state.items() if key.startswith(module + ".")}
        weights[module + ".weight"] = _decompress_f32(local, scheme)
    assert_logits_match(out, weights)


def _decompress_f32(local: dict[str, torch.Tensor], scheme) -> torch.Tensor:
    """The producer's decompress path (unpack, then its `dequantize`) in f32: its own casts to bf16, which would
    round the weights again."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    rows, half = local["weight_packed"].shape
    codes = unpack_fp4_from_uint8(local["weight_packed"], rows, half * 2, dtype=torch.float32)
    return dequantize(x_q=codes, scale=local["weight_scale"].float(), args=scheme.weights,
                      global_scale=local["weight_global_scale"], dtype=torch.float32)


def test_the_producers_decompressor_agrees_with_the_f32_reading(compressed):
    """_decompress_f32 is the producer's own decompress path with f32 in place of bf16."""
    folder, _, _ = compressed
    state = load_file(folder / "model.safetensors")
    module = "model.layers.0.mlp.up_proj"
    local = {key[len(module) + 1:]: value for key, value in state.items() if key.startswith(module + ".")}
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    theirs = NVFP4PackedCompressor.decompress(dict(local), scheme)["weight"].float()
    ours = _decompress_f32(dict(local), scheme)
    assert torch.allclose(ours.to(torch.bfloat16).float(), theirs, rtol=1e-2, atol=0)


def test_stacked_experts_share_one_global_scale():
    """Per-expert nvfp4 weights stacked into one [E, ...] tensor: with equal global scales the blobs are kept as
    they are; with different ones the smaller experts' block scales are re-rounded against the largest global scale,
    within e4m3's rounding of the values."""
    rng = np.random.default_rng(11)
    experts = [encode(rng.normal(0, scale, (32, 64)).astype(np.float32), "nvfp4", None) for scale in (1.0, 0.3)]
    same = stack_nvfp4([experts[0], experts[0]])
    np.testing.assert_array_equal(same["scale"], np.stack([experts[0]["scale"]] * 2))
    assert same["global_scale"][0] == experts[0]["global_scale"][0]
    stacked = stack_nvfp4(experts)
    assert stacked["global_scale"][0] == max(e["global_scale"][0] for e in experts)
    np.testing.assert_array_equal(stacked["q"], np.stack([e["q"] for e in experts]))
    together = decode(stacked, "nvfp4", (2, 32, 64), None)
    for index, expert in enumerate(experts):
        alone = decode(expert, "nvfp4", (32, 64), None)
        error = np.linalg.norm(together[index] - alone) / np.linalg.norm(alone)
        assert error == 0 if index == 0 else 0 < error < 0.05


# --- ModelOpt ------------------------------------------------------------------------------------------------


def modelopt_quantise(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """NVFP4 as ModelOpt's NVFP4QTensor documents it: scale_2 = amax / (6 * 448), block scale = e4m3(block amax /
    (6 * scale_2)), codes = nearest e2m1 of weight / (scale * scale_2); returns (codes [rows, cols] with bit 3 the
    sign, block scales as float8 bytes, scale_2)."""
    rows, cols = weight.shape
    scale_2 = np.float32(np.abs(weight).max() / (6 * 448))
    blocks = weight.reshape(rows, cols // 16, 16)
    block = torch.from_numpy(np.abs(blocks).max(axis=2) / (6 * scale_2)).to(torch.float8_e4m3fn)
    step = block.float().numpy() * scale_2
    scaled = blocks / step[..., None]
    magnitude = np.abs(scaled)
    codes = np.abs(magnitude[..., None] - np.array(E2M1)).argmin(axis=-1).astype(np.uint8)
    codes |= (scaled < 0).astype(np.uint8) << 3
    return codes.reshape(rows, cols), block.view(torch.uint8).numpy(), scale_2


def modelopt_dequantise(packed: np.ndarray, scale_bytes: np.ndarray, scale_2: float) -> np.ndarray:
    """The documented unpack: byte j holds element 2j (low nibble) and 2j + 1 (high nibble)."""
    rows = packed.shape[0]
    codes = np.empty((rows, packed.shape[1] * 2), dtype=np.int64)
    codes[:, 0::2], codes[:, 1::2] = packed % 16, packed // 16
    values = np.where(codes >= 8, -1.0, 1.0) * np.array(E2M1)[codes % 8]
    block = torch.from_numpy(scale_bytes).view(torch.float8_e4m3fn).double().numpy() * float(scale_2)
    return (values.reshape(rows, -1, 16) * block[..., None]).reshape(rows, -1)


def write_modelopt(folder: Path) -> dict[str, torch.Tensor]:
    """A save_pretrained llama in ModelOpt's NVFP4 export layout (lm_head excluded); returns the dequantised
    weights."""
    new_llama().save_pretrained(folder)
    state, weights = load_file(folder / "model.safetensors"), {}
    for name in [n for n in state if n.endswith("_proj.weight")]:
        module = name[: -len(".weight")]
        codes, scale_bytes, scale_2 = modelopt_quantise(state[name].float().numpy())
        packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
        state[name] = torch.from_numpy(packed)
        state[module + ".weight_scale"] = torch.from_numpy(scale_bytes).view(torch.float8_e4m3fn)
        state[module + ".weight_scale_2"] = torch.tensor(scale_2, dtype=torch.float32)
        state[module + ".input_scale"] = torch.tensor(1.0, dtype=torch.float32)
        weights[name] = torch.from_numpy(modelopt_dequantise(packed, scale_bytes, scale_2)).float()
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "exclude_modules": ["lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return weights


def test_the_modelopt_packer_writes_the_documented_layout(tmp_path):
    weights = write_modelopt(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    original = new_llama().state_dict()["model.layers.0.mlp.down_proj.weight"].float()
    down = "model.layers.0.mlp.down_proj"
    assert state[down + ".weight"].dtype == torch.uint8 and state[down + ".weight"].shape == (256, 192)
    assert state[down + ".weight_scale"].shape == (256, 24) and state[down + ".weight_scale_2"].shape == ()
    error = float((weights[down + ".weight"] - original).norm() / original.norm())
    assert 1e-2 < error < 0.2  # e2m1: a few percent, never exact


def test_modelopt_checkpoint_converts_exactly_and_matches_hf(tmp_path):
    weights = write_modelopt(tmp_path / "ckpt")
    out = convert_layers_as("nvfp4", tmp_path / "ckpt", tmp_path / "m.ninfer")
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    with read_artifact(out) as artifact:
        blobs = artifact.tensor_bytes("layers.1.attn.q_proj")
        prefix = "model.layers.1.self_attn.q_proj"
        np.testing.assert_array_equal(blobs["q"], state[prefix + ".weight"].numpy())
        np.testing.assert_array_equal(blobs["scale"], state[prefix + ".weight_scale"].view(torch.uint8).numpy())
        assert blobs["global_scale"].view(np.float32)[0] == state[prefix + ".weight_scale_2"].item()
    reference = {name: value.float() for name, value in state.items()
                 if not name.endswith(("weight_scale", "weight_scale_2", "input_scale"))}
    reference.update(weights)
    assert_logits_match(out, reference)


def test_other_modelopt_algorithms_are_refused_by_name(tmp_path):
    write_modelopt(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["quant_algo"] = "W4A8_AWQ"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match='ModelOpt quantization .*"W4A8_AWQ".* not supported'):
        convert(tmp_path, tmp_path / "out.ninfer", progress=False)
