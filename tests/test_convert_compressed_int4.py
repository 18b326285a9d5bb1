"""compressed-tensors `pack-quantized` int4 checkpoints, written by the producer itself (the `compressed-tensors`
package: its quantization config applied to a save_pretrained llama, each weight's group scales and zero points from
its own `compute_dynamic_scales_and_zp`, packed by its `ModelCompressor`), convert without re-quantising: the
artifact's int4 codes, scales and zero points are the producer's (exact), and the engine's logits match HF
transformers run on the weights the producer's own decompressor gives back."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams, compute_dynamic_scales_and_zp
from logit_tolerance import logit_tolerance
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.artifact.encodings import unpack_nibbles
from ninfer.artifact.reader import read_artifact
from ninfer.errors import ConversionError
from quantized_llama import CONFIG
from safetensors.torch import load_file, save_file

# int4 for the packed linears (the native codes are kept), f32 for the rest: only the producer's rounding remains.
INT4_RECIPE = {"rules": [{"pattern": "layers.*", "encoding": "int4", "ndim": 2}, {"pattern": "*", "encoding": "f32"}]}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
LOGICAL = {"self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj", "self_attn.v_proj": "attn.v_proj",
           "self_attn.o_proj": "attn.o_proj", "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up",
           "mlp.down_proj": "mlp.down"}
# (symmetric, strategy, group_size, model dtype): the scales are stored in the model's dtype.
SCHEMES = {
    "sym-g32-bf16": (True, "group", 32, torch.bfloat16),
    "asym-g64-bf16": (False, "group", 64, torch.bfloat16),
    "sym-g128-f16": (True, "group", 128, torch.float16),
    "asym-g128-bf16": (False, "group", 128, torch.bfloat16),
    "asym-channel-bf16": (False, "channel", None, torch.bfloat16),
}


def _weight_args(symmetric: bool, strategy: str, group_size: int | None) -> QuantizationArgs:
    return QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy=strategy, group_size=group_size)


def _qparams(module: torch.nn.Module, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """The producer's scales and zero points of a weight: per group from its own helper; per channel from each
    row's range, through the helper its observers call."""
    if args.strategy == "channel":
        weight = module.weight
        return calculate_qparams(weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True), args)
    return compute_dynamic_scales_and_zp(module.weight, args, module)


def write_packed(folder: Path, args: QuantizationArgs, dtype: torch.dtype) -> None:
    """A save_pretrained llama quantised and packed by compressed-tensors, lm_head left unquantised (as
    llm-compressor's recipes do)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(dtype)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            scale, zero_point = _qparams(module, args)
            module.weight_scale.data.copy_(scale)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zero_point)
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def packed(request, tmp_path_factory) -> tuple[Path, QuantizationArgs, Path]:
    """(checkpoint folder, its weight args, its artifact converted with INT4_RECIPE)."""
    symmetric, strategy, group_size, dtype = SCHEMES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    args = _weight_args(symmetric, strategy, group_size)
    write_packed(root / "ckpt", args, dtype)
    recipe = root / "int4.json"
    recipe.write_text(json.dumps(INT4_RECIPE))
    out = convert(root / "ckpt", root / "m.ninfer", recipe=str(recipe), progress=False)
    return root / "ckpt", args, out


def test_the_producer_wrote_pack_quantized_int4(packed):
    folder, args, _ = packed
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    state = load_file(folder / "model.safetensors")
    assert state["model.layers.0.mlp.down_proj.weight_packed"].dtype == torch.int32
    assert ("model.layers.0.mlp.down_proj.weight_zero_point" in state) == (not args.symmetric)
    assert "model.layers.0.mlp.down_proj.weight" not in state


def test_codes_scales_and_zero_points_are_the_producers(packed):
    folder, args, out = packed
    state = load_file(folder / "model.safetensors")
    with read_artifact(out) as artifact:
        for layer in range(CONFIG["num_hidden_layers"]):
            for linear in LINEARS:
                prefix = f"model.layers.{layer}.{linear}.weight"
                entry = artifact.tensor(f"layers.{layer}.{LOGICAL[linear]}")
                blobs = artifact.tensor_bytes(entry["name"])
                shape = tuple(state[prefix + "_shape"].tolist())
                codes = unpack_from_int32(state[prefix + "_packed"], 4, torch.Size(shape))
                scale = state[prefix + "_scale"].float()
                groups = shape[-1] // entry["group_size"]
                repeat = groups // scale.shape[-1]  # a coarser producer group spans whole artifact groups
                assert entry["encoding"] == "int4" and entry["group_size"] == (args.group_size or 128)
                np.testing.assert_array_equal(unpack_nibbles(blobs["q"]).astype(np.int16) - 8, codes.numpy())
                np.testing.assert_array_equal(blobs["scale"].astype(np.float32),
                                              scale.repeat_interleave(repeat, -1).numpy())
                if args.symmetric:
                    expected_zero = np.zeros((shape[0], groups), dtype=np.int16)
                else:
                    zero = unpack_from_int32(state[prefix + "_zero_point"], 4,
                                             torch.Size((shape[0], scale.shape[-1])), packed_dim=0)
                    expected_zero = zero.repeat_interleave(repeat, -1).numpy()
                np.testing.assert_array_equal(blobs["zero"].astype(np.int16) - 8, expected_zero)


def producer_weights(folder: Path, args: QuantizationArgs) -> dict[str, torch.Tensor]:
    """The checkpoint's state with each packed weight decompressed by the producer, in f32 (its scales cast up
    first, so each `(q - zero) * scale` is exact instead of rounded to the model's dtype)."""
    state = {name: value.float() if value.is_floating_point() else value
             for name, value in load_file(folder / "model.safetensors").items()}
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    weights = {}
    for name in [n for n in state if n.endswith(".weight_packed")]:
        module = name[: -len(".weight_packed")]
        local = {key[len(module) + 1:]: value for key, value in state.items() if key.startswith(module + ".")}
        weights[module + ".weight"] = PackedQuantizationCompressor.decompress(local, scheme)["weight"].float()
    weights.update({name: value for name, value in state.items() if "weight_" not in name})
    return weights


def test_logits_match_hf_on_the_producers_dequantised_weights(packed):
    import transformers

    folder, args, out = packed
    tokens = np.random.default_rng(3).integers(0, CONFIG["vocab_size"], 24).astype(np.int32)
    model = _testing.Model.open(str(out), kv_dtype="f32", threads=2, max_context=256)
    ours = model.prefill(model.new_sequence(), tokens, all_logits=True)
    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    reference.load_state_dict(producer_weights(folder, args))
    with torch.no_grad():
        theirs = reference(torch.tensor(tokens[None].astype(np.int64))).logits[0].numpy()
    assert np.abs(ours - theirs).max() <= logit_tolerance(out) * np.abs(theirs).max()


def test_groups_that_do_not_line_up_are_re_encoded_with_the_error_printed(tmp_path, caplog):
    """Groups of 16 have no artifact counterpart: the weights are re-encoded into int8 g128 from their dequantised
    values, and the converter says so with the added error."""
    write_packed(tmp_path / "ckpt", _weight_args(True, "group", 16), torch.bfloat16)
    recipe = tmp_path / "int4.json"
    recipe.write_text(json.dumps(INT4_RECIPE))
    with caplog.at_level(logging.WARNING, logger="ninfer.artifact.convert"):
        convert(tmp_path / "ckpt", tmp_path / "m.ninfer", recipe=str(recipe), progress=False)
    reports = [r.getMessage() for r in caplog.records if "layers.0.mlp.down:" in r.getMessage()]
    assert len(reports) == 1 and "re-encoded as int8 g128, relative error" in reports[0]
    assert float(reports[0].rsplit(" ", 1)[1]) > 1e-3


def test_other_compressed_tensors_schemes_are_refused_by_name(tmp_path):
    """8-bit weights, or activations quantised too, are not what the int4 encoding holds."""
    write_packed(tmp_path, _weight_args(True, "group", 32), torch.bfloat16)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="config group 'group_0'.*not supported"):
        convert(tmp_path, tmp_path / "out.ninfer", progress=False)


def test_a_scale_of_the_wrong_shape_is_refused(tmp_path):
    write_packed(tmp_path, _weight_args(False, "group", 64), torch.bfloat16)
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.0.mlp.down_proj.weight_scale"] = state["model.layers.0.mlp.down_proj.weight_scale"][:, :3].clone()
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"down_proj.weight_scale has shape \[256, 3\]; int4 \[256, 384\] "
                                              r"with groups of 64 needs \[256, 6\]"):
        convert(tmp_path, tmp_path / "out.ninfer", progress=False)


def _pack_experts(src: Path, packed: Path, dequantised: Path, args: QuantizationArgs) -> None:
    """Copies of a save_pretrained Qwen3.5-MoE folder: `packed` with every routed expert's projection compressed
    by the producer's own pack-quantized compressor, `dequantised` with those weights as its decompressor gives them
    back (f32). transformers holds the experts fused, not as Linear modules, so its quantization config cannot
    reach them; compressing each expert's state is what llm-compressor does after unfusing them."""
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    for folder in (packed, dequantised):
        shutil.copytree(src, folder)
    for shard in src.glob("*.safetensors"):
        state, plain, index = load_file(shard), {}, {}
        for name, value in state.items():
            if ".mlp.experts." not in name:
                plain[name] = value
                continue
            scale, zero_point = compute_dynamic_scales_and_zp(value, args, None)
            local = PackedQuantizationCompressor.compress(
                {"weight": value, "weight_scale": scale, "weight_zero_point": zero_point}, scheme)
            index.update({f"{name}{part[len('weight'):]}": tensor for part, tensor in local.items()})
            local["weight_scale"] = local["weight_scale"].float()
            plain[name] = PackedQuantizationCompressor.decompress(local, scheme)["weight"].float()
        save_file(plain, dequantised / shard.name, metadata={"format": "pt"})
        save_file({**{k: v for k, v in state.items() if ".mlp.experts." not in k}, **index},
                  packed / shard.name, metadata={"format": "pt"})
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    packed_map = {}
    for name, shard in weight_map.items():
        parts = ("_packed", "_scale", "_shape", "_zero_point") if ".mlp.experts." in name else ("",)
        packed_map.update({name + part: shard for part in parts if part != "_zero_point" or not args.symmetric})
    (packed / "model.safetensors.index.json").write_text(json.dumps({"weight_map": packed_map}))
    config = json.loads((src / "config.json").read_text())
    group = {"targets": ["Linear"], "format": "pack-quantized", "weights": args.model_dump()}
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                     "config_groups": {"group_0": group}}
    (packed / "config.json").write_text(json.dumps(config))


def test_per_expert_moe_weights_keep_their_codes_and_match_hf(tiny_root, tmp_path):
    from tiny_models import build_tiny_checkpoint, load_reference_vlm

    args = _weight_args(False, "group", 32)
    _pack_experts(build_tiny_checkpoint("qwen3_5_moe", tiny_root), tmp_path / "packed", tmp_path / "deq", args)
    recipe = tmp_path / "experts-int4.json"
    recipe.write_text(json.dumps({"rules": [{"pattern": "*moe.experts_*", "encoding": "int4"},
                                            {"pattern": "*", "encoding": "f32"}]}))
    out = convert(tmp_path / "packed", tmp_path / "m.ninfer", recipe=str(recipe), progress=False)

    state = {}
    for shard in (tmp_path / "packed").glob("*.safetensors"):
        state.update(load_file(shard))
    prefix = "model.language_model.layers.0.mlp.experts.{}.gate_proj.weight"
    with read_artifact(out) as artifact:
        blobs = artifact.tensor_bytes("layers.0.moe.experts_gate")
        for expert in range(blobs["q"].shape[0]):
            name = prefix.format(expert)
            shape = torch.Size(state[name + "_shape"].tolist())
            codes = unpack_from_int32(state[name + "_packed"], 4, shape)
            np.testing.assert_array_equal(unpack_nibbles(blobs["q"][expert]).astype(np.int16) - 8, codes.numpy())
            np.testing.assert_array_equal(blobs["scale"][expert].astype(np.float32), state[name + "_scale"].float())
            zero = unpack_from_int32(state[name + "_zero_point"], 4, torch.Size((shape[0], shape[1] // 32)), 0)
            np.testing.assert_array_equal(blobs["zero"][expert].astype(np.int16) - 8, zero.numpy())

    tokens = np.random.default_rng(7).integers(0, 248320, 24).astype(np.int32)
    model = _testing.Model.open(str(out), kv_dtype="f32", threads=2, max_context=256)
    ours = model.prefill(model.new_sequence(), tokens, all_logits=True)
    with torch.no_grad():
        theirs = load_reference_vlm(tmp_path / "deq")(torch.tensor(tokens[None].astype(np.int64))).logits[0].numpy()
    assert np.abs(ours - theirs).max() <= logit_tolerance(out) * np.abs(theirs).max()
